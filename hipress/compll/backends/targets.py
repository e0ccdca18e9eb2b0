"""Every target by name, for the CLI and tools (``hipress build``): the source text of a
program for the C target (OpenMP) or the CUDA target.

Only a table: each target's renderer lowers the program for itself
(:func:`hipress.compll.backends.c.program.render_c`,
:func:`hipress.compll.backends.cuda.render.cuda_source`), and a target's runner imports its own
renderer, never this module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import NamedTuple

from hipress.compll.backends.c import program as c_program
from hipress.compll.backends.cuda import render as cuda_render
from hipress.compll.backends.render import TARGETS, RenderError
from hipress.compll.ir import nodes as ir
from hipress.compll.lower.lower import Lowered


class Rendering(NamedTuple):
    """How a target renders a program: its lowering and its source text."""

    lower: Callable[[ir.Program], Lowered]
    render: Callable[[ir.Program], str]


def _cuda_text(prog: ir.Program) -> str:
    return cuda_render.cuda_source(prog).source


# in the order of TARGETS (the generator's digest knows each target's folder by the same name)
TABLE: Mapping[str, Rendering] = MappingProxyType({
    "c": Rendering(c_program.lower, c_program.render_c),
    "cuda": Rendering(cuda_render.lower, _cuda_text),
})  # fmt: skip


def _target(name: str) -> Rendering:
    if name not in TABLE:
        raise RenderError(f"unknown target {name!r} (targets: {', '.join(TARGETS)})")
    return TABLE[name]


def lowered(prog: ir.Program, target: str) -> Lowered:
    """The plans ``target`` ("c" or "cuda") renders ``prog`` from."""
    return _target(target).lower(prog)


def render(prog: ir.Program, target: str) -> str:
    """Source text of ``prog`` for ``target`` ("c" or "cuda"); equal programs give
    byte-identical text."""
    return _target(target).render(prog)


__all__ = ["TABLE", "Rendering", "lowered", "render"]
