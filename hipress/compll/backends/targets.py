"""The source text of a program for a target: the C file (OpenMP) or the CUDA file.

The one place that lowers a program for rendering: once per function and variant
(:func:`~hipress.compll.lower.lower.lower_program`), the plans then passed to the target's
renderer, which never lowers.
"""

from __future__ import annotations

from hipress.compll.backends.c.render import render_program as render_c_program
from hipress.compll.backends.cuda.abi import CudaSource
from hipress.compll.backends.cuda.render import render_program as render_cuda_program
from hipress.compll.backends.render import TARGETS, RenderError
from hipress.compll.ir import nodes as ir
from hipress.compll.lower.lower import Lowered, lower_program


def lowered(prog: ir.Program, target: str) -> Lowered:
    """The plans ``target`` ("c" or "cuda") renders ``prog`` from (CUDA runs every loop on
    its own: its encode's NaN/Inf flag may go in a loop the C target fuses)."""
    if target not in TARGETS:
        raise RenderError(f"unknown target {target!r} (targets: {', '.join(TARGETS)})")
    return lower_program(prog, unfused=target == "cuda")


def render_c(prog: ir.Program) -> str:
    """C source of ``prog`` (see :func:`hipress.compll.backends.c.render.render_program`)."""
    return render_c_program(prog, lowered(prog, "c"))


def cuda_source(prog: ir.Program) -> CudaSource:
    """CUDA source of ``prog`` with the layouts its host side needs (see
    :func:`hipress.compll.backends.cuda.render.render_program`)."""
    return render_cuda_program(prog, lowered(prog, "cuda"))


def render(prog: ir.Program, target: str) -> str:
    """Source text of ``prog`` for ``target`` ("c" or "cuda"); equal programs give
    byte-identical text."""
    if target == "c":
        return render_c(prog)
    if target == "cuda":
        return cuda_source(prog).source
    raise RenderError(f"unknown target {target!r} (targets: {', '.join(TARGETS)})")


__all__ = ["cuda_source", "lowered", "render", "render_c"]
