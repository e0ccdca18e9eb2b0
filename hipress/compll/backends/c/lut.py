"""Tabulated decode tiles: a decode whose value at ``i`` depends on ``i`` only through one
packed ``uint<w>`` payload value (``w <= 4``: 1-bit signs, TernGrad's and TBQ's 2-bit codes) takes
at most 16 values per payload; one that also reads a value per segment of ``d`` elements
(``scale[i / d]``: signSGD's and blocksign's chunk scales, QSGD's norms) takes at most 16 per
segment. A tile function of ``hp_decode_sum`` (see :mod:`.render`) evaluates the decode once
for each of them (per payload, or per segment run of the tile), divided as its stores would be,
and then only looks each element's value up (``hp_tile_lut``: a vector permute) instead of
evaluating the expression per element: the same operations on the same operands, so the same
values, in a fraction of the instructions, which is what summing several payloads in cache is
bound by. The same stage in a prep function (``f.prep``: ``hp_decode_prep_tile``, see
:mod:`.program`) fills the tables, their run ends and the unpacked values into the caller's
buffers instead, for ``hp_tile_lut_sum`` to look several payloads up in one pass.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from jinja2 import Environment

from hipress.compll.backends.cfamily.body import Body, Mem
from hipress.compll.backends.cfamily.expr import Emitter
from hipress.compll.backends.cfamily.index import is_segment_index, segment_runs
from hipress.compll.backends.cfamily.syntax import Names, ctype
from hipress.compll.ir import nodes as ir
from hipress.compll.ir.walk import walk
from hipress.compll.lower.kernel_plan import Item, Loop


class TileFunction(Protocol):
    """What these stages use of the C target's function renderer
    (:class:`hipress.compll.backends.c.render.CFunction`, which calls them)."""

    tile: bool
    prep: bool
    mem: dict[str, Mem]
    em: Emitter
    names: Names
    env: Environment

    def scaled(self, v: str) -> str: ...

    def tile_pre(self, body: Body) -> list[str]: ...

    def tile_parts(self, lp: Loop, memo: dict[tuple[str, str], str] | None = None) -> Any: ...


MAX_BITS = 4  # at most 16 entries: one AVX-512 register
SEG_MIN = 64  # segments shorter than this are decoded element by element
LUT_ROWS = f"HP_TILE / {SEG_MIN} + 2"  # most segment runs in a tile


def _segment(f: TileFunction, x: ir.Load, p: ir.Ref) -> bool:
    """Whether ``x`` reads a stored array at ``p / d``, ``d`` loop-invariant."""
    return (
        is_segment_index(f.em, x, "i", {p.name: "i"})
        and x.array in f.mem
        and f.mem[x.array].bits is None
    )


def _decode_store(f: TileFunction, lp: Loop) -> Item | None:
    """``lp``'s one item if ``lp`` is a tile function's loop storing a map to the output."""
    if not f.tile or len(lp.items) != 1:
        return None
    (it,) = lp.items
    if it.kind != "store" or not isinstance(it.op, ir.Map):
        return None
    if any(tg.kind not in ("out", "outacc") for tg in it.targets):
        return None
    return it


def _segment_value(f: TileFunction, seg: ir.Load, p: ir.Ref, level: int
                   ) -> tuple[tuple[str, str], str, str, list[str]] | None:  # fmt: skip
    """How the body reads ``seg`` (its memo key), a fresh variable for the value of segment
    ``sq``, the segment length's C, and the lines reading the value into the variable; None
    if the length is not an inline expression."""
    assert isinstance(seg.index, ir.Binary)
    probe = Body(level=level)
    idx = f.em.expr(seg.index, probe, {p.name: "i"})
    d = f.em.expr(seg.index.b, probe, {})
    if probe.lines or probe.hoist:  # pragma: no cover - invariant divisors are inline
        return None
    sv = f.names.fresh("sv")
    at = f.em._mem_read(seg.array, "sq", False, probe)
    return (seg.array, idx), sv, d, [*probe.lines, f"const {ctype(seg.dtype)} {sv} = {at};"]


def lut_source(f: TileFunction, lp: Loop) -> tuple[Item, ir.Load, ir.Load | None] | None:
    """The store, the packed load and the per-segment load (or None) of ``lp`` if ``lp`` is a
    tile function's decode of one packed value per element and at most one value per segment
    (no other per-element input, no random numbers), else None."""
    it = _decode_store(f, lp)
    if it is None:
        return None
    fn = it.op.fn
    (p,) = fn.params
    found: ir.Load | None = None
    seg: ir.Load | None = None
    refs = loads = 0
    for e in [v for _, v in fn.lets] + [fn.result]:
        for x in walk(e):
            if isinstance(x, ir.Rand):
                return None
            refs += isinstance(x, ir.Ref) and x.name == p.name
            if isinstance(x, ir.Load) and _segment(f, x, p):
                if seg is not None and seg != x:
                    return None
                seg = x
                loads += 1
            elif isinstance(x, ir.Load) and isinstance(x.index, ir.Ref) and x.index.name == p.name:
                m = f.mem.get(x.array)
                if m is None or m.bits is None or m.bits > MAX_BITS:
                    return None
                if f.em.plan.arrays[x.array].length != lp.length:
                    return None  # shorter or longer than the output: read in range per element
                if found is not None and found.array != x.array:
                    return None
                found = x
                loads += 1
    if found is None or refs != loads:
        return None
    return it, found, seg


def _unpack(f: TileFunction, lp: Loop, load: ir.Load, unp: str) -> list[str]:
    """The lines unpacking the tile's packed values of ``load`` into ``unp`` (a buffer they
    declare, or in a prep function the caller's, with the next tile's packed bytes, where
    there is a next tile, requested too, so that reading the payloads' streams overlaps
    summing this tile; the packed array is as long as the output, see :func:`lut_source`)."""
    tb = Body(level=lp.level, index="i", loop_len=lp.length, fuse=True, tile="t")
    tb.unpacked[load.array] = unp
    pre = f.tile_pre(tb)
    if f.prep:
        pre.remove(f"uint8_t {unp}[HP_TILE];")
        m = f.mem[load.array]
        assert m.bits is not None
        per = 8 // m.bits
        pre.append(f"for (int64_t pf = 0; i0 + HP_TILE < n && pf < tl / {per}; pf += 64) "
                   f"__builtin_prefetch({m.ptr} + (i0 + HP_TILE) / {per} + pf);")  # fmt: skip
    return pre


def lut_stage(f: TileFunction, lp: Loop, plain: Callable[[], str]) -> str | None:
    """``lp``'s tile as a table of its values and one look-up per element (see module doc),
    or None where :func:`lut_source` does not hold. ``plain``: the tile as its loop, which a
    per-segment table falls back to where the segment length is not positive."""
    hit = lut_source(f, lp)
    if hit is None:
        return None
    it, load, seg = hit
    bits = f.mem[load.array].bits
    assert bits is not None
    host = Body(level=lp.level)
    lq = f.names.fresh("lq")
    host.memo[(load.array, "i")] = lq  # the packed value: the table's index
    sval = None
    if seg is not None:
        (p,) = it.op.fn.params
        sval = _segment_value(f, seg, p, lp.level)
        if sval is None:  # pragma: no cover - invariant divisors are inline
            return None
        host.memo[sval[0]] = sval[1]  # the segment's value
    value = f.em.apply(it.op.fn, ["i"], host)
    lut = "hp_lut" if f.prep else f.names.fresh("lut")
    unp = "hp_unp" if f.prep else f.names.fresh("unp")
    pre = _unpack(f, lp, load, unp)
    acc = int(it.targets[0].kind == "outacc")

    def table(row: str) -> list[str]:  # the decode of every packed value into row[0..]
        return [
            f"for (int lv = 0; lv < {1 << bits}; lv++) {{",
            f"  const {ctype(load.dtype)} {lq} = ({ctype(load.dtype)})lv;",
            *(f"  {ln}" for ln in host.hoist + host.lines),
            f"  {row}[lv] = {f.scaled(value)};",
            "}",
        ]

    if sval is None and f.prep:
        lines = [f"memset({lut}[0], 0, sizeof {lut}[0]);", *table(f"{lut}[0]"), *pre,
                 "hp_ends[0] = tl;", "return 1;"]  # fmt: skip
        how = "tabulated: the table and the unpacked values"
    elif sval is None:
        lines = [f"float {lut}[16] = {{0}};", *table(lut), *pre,
                 f"hp_tile_lut({unp}, {lut}, out + i0, tl, {acc});"]  # fmt: skip
        how = "tabulated"
    else:
        _, _, d, seg_lines = sval
        runs = segment_runs("t", ", ns++")
        # every segment's table first, then the look-ups: a table read right after it is
        # written would wait on the stores (store forwarding does not cover a vector load)
        lookups = [
            "  ns = 0;",
            f"  {runs[0]}",
            f"    {runs[1]}",
            f"    hp_tile_lut({unp} + t, {lut}[ns], out + i0 + t, e - t, {acc});",
            "    t = e;",
            "  }",
        ]
        lines = [
            f"const int64_t sd = {d};",
            f"if (sd >= {SEG_MIN} && i0 >= 0) {{",
            *(f"  {ln}" for ln in pre),
            *([] if f.prep else [f"  float {lut}[{LUT_ROWS}][16];"]),
            "  int64_t ns = 0;",
            f"  {runs[0]}",
            *(f"    {ln}" for ln in [runs[1], *seg_lines]),
            f"    memset({lut}[ns], 0, sizeof {lut}[ns]);",
            *(f"    {ln}" for ln in table(f"{lut}[ns]")),
            *(["    hp_ends[ns] = e;"] if f.prep else []),
            "    t = e;",
            "  }",
            *(["  return ns;"] if f.prep else lookups),
            *(["}"] if f.prep else ["} else {", plain(), "}"]),
        ]
        how = "tables per segment and the unpacked values" if f.prep else "tabulated per segment"
    body = "".join(f"        {ln}\n" for ln in lines)
    return f"  {{ /* level {lp.level}: {it.op.name} (one tile, {how}) */\n{body}  }}\n"


def run_stage(f: TileFunction, lp: Loop, plain: Callable[[], str]) -> str | None:
    """``lp``'s tile, in a tile function, as one loop per run of a segment where its value at
    ``i`` reads a value per segment (``scale[i / d]``, int8's scales) but is not a table: the
    segment's value is read once per run into a variable instead of being copied to every
    element of a tile buffer first. None where there is no such read; ``plain`` where the
    segment length is short (or not positive)."""
    it = _decode_store(f, lp)
    if it is None:
        return None
    fn = it.op.fn
    (p,) = fn.params
    nodes = [x for e in [v for _, v in fn.lets] + [fn.result] for x in walk(e)]
    segs = [x for x in nodes if isinstance(x, ir.Load) and _segment(f, x, p)]
    if not segs or any(isinstance(x, ir.Rand) for x in nodes):
        return None
    sval = _segment_value(f, segs[0], p, lp.level)
    if sval is None:  # pragma: no cover - invariant divisors are inline
        return None
    key, sv, d, seg_lines = sval
    runs = segment_runs("t0")
    # a read the body writes differently misses this and takes the tile buffer: same values
    tile = f.tile_parts(lp, {key: sv})
    loop = f.env.get_template("c_tile.c.j2").render(
        pre=[], variants=tile.variants, clauses="", post=[], t_from="t0", t_to="e"
    )
    lines = [
        f"const int64_t sd = {d};",
        f"if (sd >= {SEG_MIN} && i0 >= 0) {{",
        *(f"  {ln}" for ln in tile.pre),
        f"  {runs[0]}",
        *(f"    {ln}" for ln in [runs[1], *seg_lines]),
    ]
    body = "".join(f"        {ln}\n" for ln in lines) + loop
    tail = ["    t0 = e;", "  }", *(f"  {ln}" for ln in tile.post), "} else {", plain(), "}"]
    body += "".join(f"        {ln}\n" for ln in tail)
    return f"{tile.hoist}  {{ /* level {lp.level}: {it.op.name} (one tile, by segment runs) */\n{body}  }}\n"


__all__ = ["LUT_ROWS", "MAX_BITS", "SEG_MIN", "lut_source", "lut_stage", "run_stage"]
