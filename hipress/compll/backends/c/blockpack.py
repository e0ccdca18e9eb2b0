"""The C target's packed payload fields filled by a ``block(...)`` section: stored by the
section itself, a block at a time, instead of a byte per element to the workspace and a loop
that packs them afterwards.

A section stores the arrays later code or a sink reads to the workspace, a packed one a value
per byte (:mod:`hipress.compll.lower.place_block`); a packed payload field is then filled by a
copy loop that reads those bytes and packs them. Where the field is the only reader, that is a
byte written and read again per element on top of the field's own bits: for a 1-bit field, 2
bytes of memory traffic per element against the 4 the gradient costs. :func:`pack_sections`
rewrites such a plan so that the section packs each block's values into the field directly
(:func:`hipress.compll.backends.c.block.render_block`: a block-sized byte buffer, packed after
the block's loop), and drops the copy and the workspace array. The same bits land in the same
bytes: a block of B elements of ``uint<k>`` covers ``B * k / 8`` whole bytes (B a multiple of
8), so threads working on different blocks write different bytes.
"""

from __future__ import annotations

import dataclasses

from hipress.compll.backends.c.block import per_block, tiled
from hipress.compll.backends.c.butterfly import split
from hipress.compll.ir import nodes as ir
from hipress.compll.ir.blocks import reads
from hipress.compll.ir.walk import walk
from hipress.compll.lower.kernel_plan import (
    Destination,
    Item,
    KernelPlan,
    Loop,
    ScatterAdd,
    frozen,
)

__all__ = ["pack_sections", "packs_in_section"]


def packs_in_section(x: ir.Map, size: int) -> bool:
    """Whether map ``x`` of a section of blocks of ``size`` can store a packed field itself:
    a ``uint<k>`` map (k < 8) run as a tile loop over whole bytes of the field."""
    bits = x.type.bits
    if bits is None or bits >= 8 or not tiled(size):
        return False
    return split(per_block(x.fn, size), size) is None


def _copy_of(it: Item, name: str) -> str | None:
    """The payload field ``it`` copies array ``name`` into, if it is such a copy."""
    m = it.op
    if not (it.copy and isinstance(m, ir.Map) and len(it.targets) == 1):
        return None
    tg = it.targets[0]
    res = m.fn.result
    plain = isinstance(res, ir.Load) and res.array == name and res.index == m.fn.params[0]
    return tg.name if tg.kind == "payload" and plain and not m.fn.lets else None


def _readers(plan: KernelPlan, prog: ir.Program, name: str, own: ir.Block) -> int:
    """How many ops of ``plan`` (its section ``own`` aside) and final stores read ``name``."""
    n = 0
    for step in plan.steps:
        for lp in step.loops:
            n += sum(name in reads(it.op) for it in lp.items)
        for sp in step.specials:
            op = sp.op.op if isinstance(sp.op, ScatterAdd) else sp.op
            n += op is not own and name in reads(op)
    finals = [v for v in prog.encode.fields if not isinstance(v, str)]
    finals += [s.value for s in plan.final_state if not isinstance(s.value, str)]
    for e in finals:
        n += any(isinstance(x, ir.Load) and x.array == name for x in walk(e))
    return n


def _candidates(plan: KernelPlan, prog: ir.Program) -> dict[str, tuple[str, Item]]:
    """Array name -> (payload field, the copy item) for each packed field a section may fill
    (the copy's loop run by no fusion)."""
    out: dict[str, tuple[str, Item]] = {}
    sections = [sp.op for st in plan.steps for sp in st.specials if isinstance(sp.op, ir.Block)]
    fused = {id(lp) for f in plan.fusions for lp in (*f.seg_loops, *f.elem_loops)}
    fused |= {id(f.loop) for f in plan.filter_fusions}
    for sec in sections:
        for x in sec.ops:
            if not (isinstance(x, ir.Map) and packs_in_section(x, sec.size)):
                continue
            if plan.homes.get(x.name) != Destination("ws", x.name):
                continue
            copies = [(f, lp, it) for st in plan.steps for lp in st.loops for it in lp.items
                      if (f := _copy_of(it, x.name)) is not None]  # fmt: skip
            if len(copies) != 1 or _readers(plan, prog, x.name, sec) != 1:
                continue  # read elsewhere too: it stays in the workspace
            field, lp, it = copies[0]
            m = it.op
            same = m.type.bits == x.type.bits and m.type.length == x.type.length
            if same and id(lp) not in fused:
                out[x.name] = (field, it)
    return out


def pack_sections(prog: ir.Program, plan: KernelPlan) -> KernelPlan:
    """``plan`` (an encode's) with each packed payload field that a section's map fills, and
    nothing else reads, stored by the section (module docstring); ``plan`` itself where there
    is none."""
    if plan.fn != "encode":
        return plan
    found = _candidates(plan, prog)
    if not found:
        return plan
    drop = {id(it) for _, it in found.values()}  # (their loops are in no fusion)
    steps = []
    for st in plan.steps:
        loops = []
        for lp in st.loops:
            kept = tuple(it for it in lp.items if id(it) not in drop)
            if kept:
                loops.append(lp if len(kept) == len(lp.items) else
                             Loop(lp.level, lp.length, kept))  # fmt: skip
        steps.append(dataclasses.replace(st, loops=tuple(loops)))
    homes = {**plan.homes, **{n: Destination("payload", f) for n, (f, _) in found.items()}}
    ws = tuple(a for a in plan.ws if a.name not in found)
    return dataclasses.replace(plan, homes=frozen(homes), steps=tuple(steps), ws=ws)
