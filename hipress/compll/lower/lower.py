"""Stage: IR -> kernel plan. Decides which loops run, what each computes and where arrays live.

The steps: :func:`~hipress.compll.lower.place.place` (homes and levels, with the maps
:mod:`~hipress.compll.lower.defer` defers to a filter), :func:`~hipress.compll.lower.assemble.assemble`
(in-place state, copies, loops), then the passes over the plan, each returning a new one:
:func:`~hipress.compll.lower.fuse.fuse` (segment reductions with their consumers) and
:func:`~hipress.compll.lower.finite.add_flag` (the gradient's NaN/Inf flag).

The plan is shared by every native target (C and CUDA render the same plan). Rules:

- A ``map`` is *virtual* (never stored; its lambda is inlined wherever it is read, at any index)
  unless it is a sink (payload field, new state, decode result) or it is expensive (random
  numbers, divisions) and read from more than one place or at another index.
- Work is grouped into *levels*. A loop item (a stored map or a standard reduction) runs at the
  first level where everything it reads is ready; items of one level and one length fuse into one
  parallel loop. A map read at ``[i]`` by an item of its own loop is taken from registers.
  Filter, topk, sort, scan, segreduce, scatter and custom reductions are stages of their own.
- Host scalars (``let``) are computed between levels, as soon as their inputs are ready.
- A stored map that a filter over its own length reads at the filter's index (``[j]``, or
  rotated, ``[(j + h) % n]``), and that is elementwise in its inputs, is *deferred* to the
  filter: it is stored at the filter's level, in a loop of its own that a target may run inside
  the filter's pass (:class:`FilterFusion`); readers before that level recompute it.
- A new state array is written in place when no later reader needs the old values; otherwise it
  goes to the workspace and is copied at the end.
"""

from __future__ import annotations

from dataclasses import dataclass

from hipress.compll.ir import nodes as ir
from hipress.compll.ir.blocks import flatten_program
from hipress.compll.lower.assemble import assemble
from hipress.compll.lower.finite import add_flag
from hipress.compll.lower.fuse import fuse
from hipress.compll.lower.kernel_plan import KernelPlan
from hipress.compll.lower.place import place
from hipress.compll.lower.sparse import SparseDecode, sparse_decode


def lower(
    prog: ir.Program,
    fn: str,
    accumulate: bool = False,
    nonfinite: bool = False,
    unfused: bool = False,
    sections: bool = False,
) -> KernelPlan:
    """Plan ``prog``'s ``fn`` ("encode" or "decode"; decode with or without accumulation);
    with ``nonfinite``, an encode also finds out whether the gradient holds NaN/Inf where its
    first pass can (:mod:`hipress.compll.lower.finite`), for a target that runs the plan's fusions
    or, with ``unfused``, one that runs every loop on its own (CUDA), and runs a
    ``block(...)`` section as its ops (:func:`~hipress.compll.ir.blocks.flatten_program`)
    unless ``sections`` (it runs each section left in ``prog`` as one stage)."""
    if fn not in ("encode", "decode"):
        raise ValueError(f"fn must be 'encode' or 'decode', got {fn!r}")
    if unfused and not sections:
        prog = flatten_program(prog)
    plan = fuse(assemble(place(prog, fn, accumulate)))
    if nonfinite:
        plan = add_flag(plan, prog, unfused)
    return plan


@dataclass(frozen=True)
class Lowered:
    """The plans of one program for one target: what every renderer is given.

    ``encode`` reports the gradient's NaN/Inf flag where its first pass can; ``decode`` and
    ``decode_acc`` (accumulating into the output) are the two decode variants; ``sparse`` is
    the program's sparse decode form, if it has one (:mod:`hipress.compll.lower.sparse`).
    """

    encode: KernelPlan
    decode: KernelPlan
    decode_acc: KernelPlan
    sparse: SparseDecode | None


def lower_program(prog: ir.Program, unfused: bool = False, sections: bool = False) -> Lowered:
    """Lower ``prog`` once per function and variant (see :func:`lower`; ``unfused``: for a
    target that runs every loop on its own, and every ``block(...)`` section as its ops unless
    ``sections``)."""
    if unfused and not sections:
        prog = flatten_program(prog)
    return Lowered(
        encode=lower(prog, "encode", nonfinite=True, unfused=unfused, sections=sections),
        decode=lower(prog, "decode", accumulate=False),
        decode_acc=lower(prog, "decode", accumulate=True),
        sparse=sparse_decode(prog),
    )


def reports_nonfinite(prog: ir.Program) -> bool:
    """Whether an encode of ``prog`` finds out if the gradient holds NaN/Inf on every target:
    its encode lowered for C (fused) and for CUDA (``unfused``) both compute the flag
    (:mod:`hipress.compll.lower.finite`). Where only one could, the algorithm reports it on
    none, so it answers alike everywhere."""
    return all(
        lower(prog, "encode", nonfinite=True, unfused=u).nonfinite is not None
        for u in (False, True)
    )


__all__ = ["Lowered", "lower", "lower_program", "reports_nonfinite"]
