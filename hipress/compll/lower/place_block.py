"""Placing a ``block(...)`` section on the C target (see :mod:`hipress.compll.ir.blocks`): the
section is one stage; the arrays it defines are its own (read only inside it, ready there),
except those later code or a sink reads, which it stores to the workspace."""

from __future__ import annotations

from typing import Any

from hipress.compll.ir import nodes as ir
from hipress.compll.ir.blocks import outs
from hipress.compll.ir.fold import segment_count
from hipress.compll.lower.kernel_plan import Array, Destination, Special


def sink_names(prog: ir.Program, fn: str) -> set[str]:
    """The arrays ``prog``'s ``fn`` hands out: payload fields and new state (encode), the
    result (decode)."""
    if fn == "decode":
        return {prog.decode.result}
    out = {v for v in prog.encode.fields if isinstance(v, str)}
    out |= {s.value for s in prog.encode.ops if isinstance(s, ir.StoreState)
            and isinstance(s.value, str)}  # fmt: skip
    return out


def block_outs(placer: Any, op: ir.Block) -> tuple[str, ...]:
    """The arrays section ``op`` of ``placer``'s function stores."""
    k = next(i for i, x in enumerate(placer.ops) if x is op)
    return outs(op, placer.ops[k + 1 :], sink_names(placer.prog, placer.fn))


def declare_block(placer: Any, op: ir.Block) -> None:
    """Declare the section's arrays: origin "op" (stored) for its outputs, "block" (kept
    inside the stage) for the rest; a stored packed array is stored a value per byte."""
    stored = set(block_outs(placer, op))
    for x in op.ops:
        if isinstance(x, ir.Map):
            t = x.type
            length, dt, bits = t.length, t.dtype, t.bits
        elif isinstance(x, ir.SegReduce):
            length, dt, bits = segment_count(x.length, x.seg), x.dtype, None
        else:  # pragma: no cover - the checker keeps maps and segment reductions only
            raise TypeError(f"not a section op: {x!r}")
        keep = x.name in stored
        placer.arrays[x.name] = Array(x.name, dt, length, None if keep else bits,
                                      "op" if keep else "block")  # fmt: skip
        if keep:  # ready inside the section itself (its level comes in place_block)
            placer.levels[x.name] = 0


def place_block(placer: Any, op: ir.Op, lv: int) -> None:
    """The section as a stage of level ``lv``; its outputs go to the workspace."""
    if not isinstance(op, ir.Block):  # pragma: no cover - every op kind is placed
        raise TypeError(f"cannot place {type(op).__name__}")
    placer.specials.append(Special(lv, op, None))
    for name in block_outs(placer, op):
        placer.homes[name] = Destination("ws", name)
        placer.levels[name] = lv
