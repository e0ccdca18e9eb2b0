"""Butterfly stages of a ``block(B)`` section on the C target: maps that choose on bit ``d`` of
their index, and chains of add/subtract butterflies (a Hadamard transform) kept in registers.

A map ``(i & d) == 0 ? lo : hi`` is split into its two branches (:func:`split`). A map of the
exact form ``(i & d) == 0 ? h[i] + h[i + d] : h[i - d] - h[i]`` (f32) is a butterfly stage
(:func:`stage`); consecutive stages, each read by the next alone, form a chain
(:func:`chains`). On whole blocks of at most 16 vectors a chain runs in SIMD registers
(:func:`registers`): the block is loaded once, every stage runs in its order (a stage across
vectors as one add and one subtract per pair of vectors, one within a vector as a lane swap and
a fused multiply-add by +-1), and the result is stored once. Each element gets the same sums
and differences of the same operands in the same order as the stage-by-stage loops: the same
values. ``fma(v, -1, t)`` is ``t - v`` rounded once, zeros' signs included; where both are NaN
it may keep the other's payload, which the language never shows (bit casts and payloads store
every NaN alike).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hipress.compll.ir import nodes as ir
from hipress.compll.ir import ops
from hipress.compll.ir.blocks import unmask
from hipress.compll.ir.types import F32
from hipress.compll.ir.walk import lambda_exprs, walk

SPLIT_MIN = 8  # a map choosing on bit d of its index runs as pairs from d = SPLIT_MIN up
MAX_VECTORS = 16  # a chain runs in registers on blocks of at most this many vectors

# each SIMD width: its preprocessor test, vector type and intrinsics' prefix; per lane distance
# d below the width, the lane swap (i <-> i ^ d)
WIDTHS = {
    16: ("defined(__AVX512F__) && !defined(HP_NO_AVX512)", "__m512", "_mm512"),
    8: ("defined(__AVX2__) && defined(__FMA__) && !defined(HP_NO_AVX2)", "__m256", "_mm256"),
}
_SWAP = {
    16: {1: "_mm512_permute_ps({v}, 0xB1)", 2: "_mm512_permute_ps({v}, 0x4E)",
         4: "_mm512_shuffle_f32x4({v}, {v}, 0xB1)", 8: "_mm512_shuffle_f32x4({v}, {v}, 0x4E)"},
    8: {1: "_mm256_permute_ps({v}, 0xB1)", 2: "_mm256_permute_ps({v}, 0x4E)",
        4: "_mm256_permute2f128_ps({v}, {v}, 0x01)"},
}  # fmt: skip


def split(
    fn: ir.Lambda, size: int, least: int = SPLIT_MIN
) -> tuple[int, ir.Lambda, ir.Lambda] | None:
    """``fn`` as ``(i & d) == 0 ? lo : hi`` (``d >= least`` a power of two, ``2d`` dividing
    the block): ``d`` and the two branches as lambdas of their own, else None."""
    e, i = fn.result, fn.params[0]
    if not (isinstance(e, ir.Select) and isinstance(e.cond, ir.Binary)):
        return None
    c = e.cond
    if c.op not in (ops.EQ.name, ops.NE.name) or c.b != ir.Const(0, c.b.dtype):
        return None
    m = c.a
    if not (isinstance(m, ir.Binary) and m.op == ops.BAND.name and m.a == i):
        return None
    if not (isinstance(m.b, ir.Const) and m.b.dtype == i.dtype):
        return None
    d = int(m.b.value)
    if d < least or d & (d - 1) or size % (2 * d):
        return None
    lo, hi = (e.a, e.b) if c.op == ops.EQ.name else (e.b, e.a)
    return d, ir.Lambda(fn.params, fn.lets, lo), ir.Lambda(fn.params, fn.lets, hi)


def _at(x: ir.Expr, i: ir.Ref, c: int) -> bool:
    """Whether ``x`` is a float32 load at ``i + c``."""
    if not (isinstance(x, ir.Load) and x.dtype == F32):
        return False
    ix = unmask(x.index)
    if c == 0:
        return ix == i
    op = ops.ADD.name if c > 0 else ops.SUB.name
    return ix == ir.Binary(op, i, ir.Const(abs(c), i.dtype), i.dtype)


def stage(x: ir.Map, size: int) -> tuple[int, str] | None:
    """``x`` as the butterfly ``(i & d) == 0 ? h[i] + h[i + d] : h[i - d] - h[i]`` of an f32
    array ``h``: ``(d, h)``, else None."""
    if x.type.dtype != F32 or x.type.bits is not None or x.fn.lets:
        return None
    got = split(x.fn, size, least=1)
    if got is None:
        return None
    d, lo, hi = got
    a, b, i = lo.result, hi.result, x.fn.params[0]
    if not (isinstance(a, ir.Binary) and a.op == ops.ADD.name):
        return None
    if not (isinstance(b, ir.Binary) and b.op == ops.SUB.name):
        return None
    if not (_at(a.a, i, 0) and _at(a.b, i, d) and _at(b.a, i, -d) and _at(b.b, i, 0)):
        return None
    names = {y.array for y in (a.a, a.b, b.a, b.b) if isinstance(y, ir.Load)}
    return (d, names.pop()) if len(names) == 1 else None


@dataclass(frozen=True)
class Chain:
    """Section ops ``[first, last]``: butterfly stages at distances ``ds``, the first reading
    the section map at op ``src``."""

    first: int
    last: int
    ds: tuple[int, ...]
    src: int


def chains(block: ir.Block, buffered: Sequence[bool], homes: set[str]) -> dict[int, Chain]:
    """The section's butterfly chains by their first op: consecutive stages of one length,
    each but the last read by the next alone and stored nowhere; the first reads a map of the
    section kept in a buffer, the last is kept in a buffer (``buffered``: per op)."""
    ops_ = block.ops
    pos = {x.name: k for k, x in enumerate(ops_)}
    readers: dict[str, set[int]] = {}
    for k, x in enumerate(ops_):
        for e in lambda_exprs(x.fn):
            for ld in walk(e):
                if isinstance(ld, ir.Load):
                    readers.setdefault(ld.array, set()).add(k)
    found: dict[int, Chain] = {}
    k = 0
    while k < len(ops_):
        x = ops_[k]
        got = stage(x, block.size) if isinstance(x, ir.Map) else None
        src = ops_[pos[got[1]]] if got is not None and got[1] in pos else None
        if not (isinstance(src, ir.Map) and buffered[pos[src.name]]):
            k += 1
            continue
        ds, last = [got[0]], k
        while last + 1 < len(ops_):
            y, cur = ops_[last + 1], ops_[last]
            nxt = stage(y, block.size) if isinstance(y, ir.Map) else None
            if nxt is None or nxt[1] != cur.name or cur.name in homes:
                break
            if readers.get(cur.name) != {last + 1} or repr(y.type.length) != repr(x.type.length):
                break
            ds.append(nxt[0])
            last += 1
        if buffered[last]:
            found[k] = Chain(k, last, tuple(ds), pos[src.name])
        k = last + 1
    return found


def widths(size: int) -> list[int]:
    """The SIMD widths whose registers hold a block of ``size`` elements."""
    return [w for w in WIDTHS if size % w == 0 and size // w <= MAX_VECTORS]


def registers(w: int, size: int, ds: Sequence[int], src: str, dst: str) -> list[str]:
    """C statements running stages ``ds`` on the block at ``src`` (``size`` floats) in
    registers of ``w`` lanes and storing the result at ``dst``."""
    _, vt, p = WIDTHS[w]
    nv = size // w
    v = [f"hp_v{j}" for j in range(nv)]
    out = [f"{vt} {v[j]} = {p}_loadu_ps({src} + {w * j});" for j in range(nv)]
    for d in sorted({d for d in ds if d < w}):  # +1 in the lanes that add, -1 where they subtract
        signs = ", ".join("-1.0f" if lane & d else "1.0f" for lane in reversed(range(w)))
        out.append(f"const {vt} hp_sg{d} = {p}_set_ps({signs});")
    for d in ds:
        if d >= w:
            s = d // w
            for j in range(nv):
                if not j & s:
                    a, b = v[j], v[j + s]
                    out.append(f"{{ const {vt} a = {a}; {a} = {p}_add_ps(a, {b}); "
                               f"{b} = {p}_sub_ps(a, {b}); }}")  # fmt: skip
            continue
        for x in v:  # low lanes x + t (h[i] + h[i + d]), high lanes t - x (h[i - d] - h[i])
            t = _SWAP[w][d].format(v=x)
            out.append(f"{x} = {p}_fmadd_ps({x}, hp_sg{d}, {t});")
    out += [f"{p}_storeu_ps({dst} + {w * j}, {v[j]});" for j in range(nv)]
    return out
