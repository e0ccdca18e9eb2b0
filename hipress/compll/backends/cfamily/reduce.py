"""Reductions in C: accumulators, per-element updates and how partial results combine (shared
by the C and CUDA renderers; :func:`reduction` gives the pieces a loop or a stage fills in)."""

from __future__ import annotations

from dataclasses import dataclass

from hipress.compll.backends.cfamily.syntax import Names, const, ctype
from hipress.compll.ir import ops
from hipress.compll.ir.types import DType


@dataclass(frozen=True)
class Acc:
    ctype: str
    name: str
    init: str
    clause: str  # OpenMP reduction operator: + min max | &


@dataclass(frozen=True)
class Reduction:
    accs: tuple[Acc, ...]
    update: tuple[str, ...]
    final: str  # in terms of the accumulator names


def _key_init(dt: DType, which: str) -> str:
    """The order key of +inf (min) or -inf (max) for float type ``dt``."""
    bits = dt.bits
    b = (0x7F800000 if bits == 32 else 0x7FF0000000000000) | (
        (1 << (bits - 1)) if which == "max" else 0
    )
    if b >= 1 << (bits - 1):
        b -= 1 << bits
    k = b ^ ((b >> (bits - 1)) & ((1 << (bits - 1)) - 1))
    return f"INT64_C({k})" if bits == 64 else f"({k})"


def reduction(op: str, v: str, dt: DType, out: DType, length: str, names: Names) -> Reduction:
    """Accumulators and statements reducing values ``v`` (type ``dt``) with ``op``."""
    a = names.fresh("acc")
    if op == ops.REDUCE_SUM.name:
        if dt.is_float:
            return Reduction((Acc("double", a, "0.0", "+"),), (f"{a} += (double)({v});",),
                             f"(({ctype(out)}){a})")  # fmt: skip
        return Reduction((Acc("uint64_t", a, "0", "+"),), (f"{a} += (uint64_t)(int64_t)({v});",),
                         f"((int64_t){a})")  # fmt: skip
    if op == ops.REDUCE_COUNT.name:
        return Reduction((Acc("int64_t", a, "0", "+"),), (f"{a} += (int64_t)({v});",), a)
    if op in (ops.REDUCE_ANY.name, ops.REDUCE_ALL.name):
        init, sym = ("0", "|") if op == ops.REDUCE_ANY.name else ("1", "&")
        return Reduction((Acc("int", a, init, sym),), (f"{a} {sym}= (int)({v});",), f"({a} != 0)")
    if op == ops.REDUCE_ABSMAX.name and dt.name in ("f32", "f64"):
        # the bits of |x| order like |x|, and NaNs (cleared sign) above every other value
        kt, ut, w = ("int32_t", "uint32_t", 31) if dt.bits == 32 else ("int64_t", "uint64_t", 63)
        kx = names.fresh("k")
        inf = "0x7f800000" if dt.bits == 32 else "INT64_C(0x7ff0000000000000)"
        upd = (
            f"const {kt} {kx} = ({kt})(hp_{dt.name}_bits({v}) & ((({ut})1 << {w}) - 1));",
            f"{a} = {kx} > {a} ? {kx} : {a};",
        )
        val = f"hp_{dt.name}_from_bits(({ut}){a})"
        final = f"({a} > {inf} ? {const(float('nan'), dt)} : {val})"
        return Reduction((Acc(kt, a, "0", "max"),), upd, final)
    # min, max, absmax
    which = "min" if op == ops.REDUCE_MIN.name else "max"
    x = names.fresh("x")
    xv = (
        (f"fabs{'f' if dt.name == 'f32' else ''}({v})" if dt.is_float else f"hp_abs_{dt.name}({v})")
        if op == ops.REDUCE_ABSMAX.name
        else v
    )
    if dt.is_float:
        kt = "int32_t" if dt.bits == 32 else "int64_t"
        nf = names.fresh("nan")
        kx = names.fresh("k")
        upd = (
            f"const {ctype(dt)} {x} = {xv};",
            f"const {kt} {kx} = hp_key_{dt.name}({x});",
            f"{a} = {kx} {'<' if which == 'min' else '>'} {a} ? {kx} : {a};",
            f"{nf} |= ({x} != {x});",
        )
        val = f"hp_unkey_{dt.name}({a})"
        if op == ops.REDUCE_ABSMAX.name:
            val = f"({length} == 0 ? {const(0, dt)} : {val})"
        final = f"({nf} ? {const(float('nan'), dt)} : {val})"
        return Reduction(
            (Acc(kt, a, _key_init(dt, which), which), Acc("int", nf, "0", "|")), upd, final
        )
    lim = {"min": "max", "max": "min"}[which]
    init = _int_limit(dt, lim)
    upd = (f"const {ctype(dt)} {x} = {xv};",
           f"{a} = {x} {'<' if which == 'min' else '>'} {a} ? {x} : {a};")  # fmt: skip
    final = f"({length} == 0 ? {const(0, dt)} : {a})" if op == ops.REDUCE_ABSMAX.name else a
    return Reduction((Acc(ctype(dt), a, init, which),), upd, final)


def _int_limit(dt: DType, which: str) -> str:
    if dt.is_signed:
        v = (1 << (dt.bits - 1)) - 1 if which == "max" else -(1 << (dt.bits - 1))
    else:
        v = (1 << dt.bits) - 1 if which == "max" else 0
    return const(v, dt)


def combine_acc(acc: Acc, tot: str, part: str) -> str:
    if acc.clause == "+":
        return f"{tot} += {part};"
    if acc.clause in ("|", "&"):
        return f"{tot} {acc.clause}= {part};"
    cmp = "<" if acc.clause == "min" else ">"
    return f"{tot} = {part} {cmp} {tot} ? {part} : {tot};"


def minmax_identity(op: str, dt: DType) -> str:
    """The identity of a ``min`` or ``max`` scan over ``dt``."""
    if dt.is_float:
        return const(float("inf") if op == ops.REDUCE_MIN.name else float("-inf"), dt)
    return _int_limit(dt, "max" if op == ops.REDUCE_MIN.name else "min")
