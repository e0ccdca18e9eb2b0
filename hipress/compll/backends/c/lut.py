"""Tabulated decode tiles: a decode whose value at ``i`` depends on ``i`` only through one
packed ``uint<w>`` payload value (``w <= 4``: 1-bit signs, TernGrad's and TBQ's 2-bit codes) takes
at most 16 values per payload. A tile function of ``hp_decode_sum`` (see :mod:`.render`)
evaluates the decode once for each of them, divided as its stores would be, and then only looks
each element's value up (``hp_tile_lut``: a vector permute) instead of evaluating the
expression per element: the same operations on the same operands, so the same values, in a
fraction of the instructions, which is what summing several payloads in cache is bound by.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hipress.compll.backends.cfamily.body import Body
from hipress.compll.backends.cfamily.syntax import ctype
from hipress.compll.ir import nodes as ir
from hipress.compll.ir.walk import walk
from hipress.compll.lower.kernel_plan import Item, Loop

if TYPE_CHECKING:
    from hipress.compll.backends.c.render import CFunction

MAX_BITS = 4  # at most 16 entries: one AVX-512 register


def lut_source(f: CFunction, lp: Loop) -> tuple[Item, ir.Load] | None:
    """The store and the packed load of ``lp`` if ``lp`` is a tile function's decode of one
    packed value per element (no other per-element input, no random numbers), else None."""
    if not f.tile or len(lp.items) != 1:
        return None
    (it,) = lp.items
    if it.kind != "store" or not isinstance(it.op, ir.Map):
        return None
    if any(tg.kind not in ("out", "outacc") for tg in it.targets):
        return None
    fn = it.op.fn
    (p,) = fn.params
    found: ir.Load | None = None
    refs = loads = 0
    for e in [v for _, v in fn.lets] + [fn.result]:
        for x in walk(e):
            if isinstance(x, ir.Rand):
                return None
            refs += isinstance(x, ir.Ref) and x.name == p.name
            if isinstance(x, ir.Load) and isinstance(x.index, ir.Ref) and x.index.name == p.name:
                m = f.mem.get(x.array)
                if m is None or m.bits is None or m.bits > MAX_BITS:
                    return None
                if found is not None and found.array != x.array:
                    return None
                found = x
                loads += 1
    if found is None or refs != loads:
        return None
    return it, found


def lut_stage(f: CFunction, lp: Loop) -> str | None:
    """``lp``'s tile as a table of its values and one look-up per element (see module doc),
    or None where :func:`lut_source` does not hold."""
    hit = lut_source(f, lp)
    if hit is None:
        return None
    it, load = hit
    bits = f.mem[load.array].bits
    assert bits is not None
    host = Body(level=lp.level)
    lq = f.names.fresh("lq")
    host.memo[(load.array, "i")] = lq  # the packed value: the table's index
    value = f.em.apply(it.op.fn, ["i"], host)
    lut, unp = f.names.fresh("lut"), f.names.fresh("unp")
    tb = Body(level=lp.level, index="i", loop_len=lp.length, fuse=True, tile="t")
    tb.unpacked[load.array] = unp
    acc = int(it.targets[0].kind == "outacc")
    lines = [
        f"float {lut}[16] = {{0}};",
        f"for (int lv = 0; lv < {1 << bits}; lv++) {{",
        f"  const {ctype(load.dtype)} {lq} = ({ctype(load.dtype)})lv;",
        *(f"  {ln}" for ln in host.hoist + host.lines),
        f"  {lut}[lv] = {f.scaled(value)};",
        "}",
        *f.tile_pre(tb),
        f"hp_tile_lut({unp}, {lut}, out + i0, tl, {acc});",
    ]
    body = "".join(f"        {ln}\n" for ln in lines)
    return f"  {{ /* level {lp.level}: {it.op.name} (one tile, tabulated) */\n{body}  }}\n"


__all__ = ["MAX_BITS", "lut_source", "lut_stage"]
