"""C text of the builtins that see a float's representation (shared by the C and CUDA targets):
the bit casts, ``exponent`` and ``ldexp``, with the semantics of
:mod:`hipress.compll.ir.semantics`.

Only helpers every prelude defines are used (``hp_f32_bits``, ``hp_f64_from_bits``,
``hp_sel_*``), so kernels that do not use these builtins are unchanged. Everything is integer
work or exact float arithmetic plus one final rounding, which IEEE hardware does identically on
CPUs and GPUs (subnormals are kept on both: no fast math, no flush to zero).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from hipress.compll.ir import ops
from hipress.compll.ir.types import DType

# (C type, C expression) -> an identifier holding the value (an operand read more than once)
Bind = Callable[[str, str], str]


def _pow2(k: str) -> str:
    """2^k as a double, for int64 ``k`` in [-1022, 1023] (built from its bits)."""
    return f"hp_f64_from_bits((uint64_t)({k} + 1023) << 52)"


def _as_f32(x: str, src: DType, bind: Bind) -> str:
    return f"hp_f32_from_bits((uint32_t)({x}))"


def _as_f64(x: str, src: DType, bind: Bind) -> str:
    return f"hp_f64_from_bits((uint64_t)({x}))"


def _f32_bits(x: str, bind: Bind) -> str:
    v = bind("float", x)
    return f"hp_sel_u32({v} != {v}, UINT32_C(0x7fc00000), hp_f32_bits({v}))"


def _as_u32(x: str, src: DType, bind: Bind) -> str:
    return _f32_bits(x, bind)


def _as_i32(x: str, src: DType, bind: Bind) -> str:
    return f"((int32_t){_f32_bits(x, bind)})"


def _as_i64(x: str, src: DType, bind: Bind) -> str:
    v = bind("double", x)
    return f"hp_sel_i64({v} != {v}, INT64_C(0x7ff8000000000000), (int64_t)hp_f64_bits({v}))"


def unary(op: str, x: str, src: DType, bind: Bind) -> str:
    """``op`` of ``x`` (of type ``src``), an operation of :data:`UNARY`; bit casts of a NaN
    give the positive quiet NaN."""
    rule = UNARY.get(op)
    if rule is None:
        raise ValueError(f"unknown unary op {op} on {src}")
    return rule(x, src, bind)


def _exponent(x: str, src: DType, bind: Bind) -> str:
    # a subnormal's magnitude bits a (< 2^mantissa) convert exactly to a float whose exponent
    # field is floor(log2 a) + bias
    if src.name == "f32":
        a = bind("uint32_t", f"(hp_f32_bits({x}) & UINT32_C(0x7fffffff))")
        sub = f"(int32_t)(hp_f32_bits((float){a}) >> 23) - 276"
        return (
            f"hp_sel_i32({a} >= UINT32_C(0x7f800000), 128, hp_sel_i32({a} == 0u, -150, "
            f"hp_sel_i32({a} < UINT32_C(0x800000), {sub}, (int32_t)({a} >> 23) - 127)))"
        )
    a = bind("uint64_t", f"(hp_f64_bits({x}) & UINT64_C(0x7fffffffffffffff))")
    sub = f"(int32_t)(hp_f64_bits((double){a}) >> 52) - 2097"
    return (
        f"hp_sel_i32({a} >= UINT64_C(0x7ff0000000000000), 1024, hp_sel_i32({a} == 0u, -1075, "
        f"hp_sel_i32({a} < UINT64_C(0x10000000000000), {sub}, (int32_t)({a} >> 52) - 1023)))"
    )


UNARY: Mapping[str, Callable[[str, DType, Bind], str]] = MappingProxyType({
    ops.AS_F32.name: _as_f32,
    ops.AS_F64.name: _as_f64,
    ops.AS_U32.name: _as_u32,
    ops.AS_I32.name: _as_i32,
    ops.AS_I64.name: _as_i64,
    ops.EXPONENT.name: _exponent,
})  # fmt: skip


def _fmix32(h: str, bind: Bind) -> str:
    """MurmurHash3's 32-bit finaliser of uint32_t ``h`` (unsigned products wrap mod 2**32)."""
    h = bind("uint32_t", h)
    for step in ("{h} ^ ({h} >> 16)", "{h} * UINT32_C(0x85ebca6b)", "{h} ^ ({h} >> 13)",
                 "{h} * UINT32_C(0xc2b2ae35)", "{h} ^ ({h} >> 16)"):  # fmt: skip
        h = bind("uint32_t", "(" + step.format(h=h) + ")")
    return h


def hash32(seed: str, i: str, bind: Bind, tile: str | None = None) -> str:
    """``hash(seed, i)`` of two int64 operands, a uint32_t (see semantics.hash32). ``tile``:
    ``i`` is ``i0 + tile`` in a tile whose indices share the upper 32 bits of ``i0`` (see
    ``Body.aligned``): the low word is then a 32-bit sum and the high word one per tile,
    instead of 64-bit lanes."""
    s = bind("uint64_t", f"(uint64_t)({seed})")
    if tile is None:
        c = bind("uint64_t", f"(uint64_t)({i})")
        lo, hi = f"(uint32_t){c}", f"(uint32_t)({c} >> 32)"
    else:
        lo = bind("uint32_t", f"((uint32_t)i0 + (uint32_t){tile})")
        hi = "(uint32_t)((uint64_t)i0 >> 32)"
    h = _fmix32(f"((uint32_t){s} ^ UINT32_C(0x9e3779b9))", bind)
    h = _fmix32(f"({h} ^ (uint32_t)({s} >> 32))", bind)
    h = _fmix32(f"({h} ^ {lo})", bind)
    return _fmix32(f"({h} ^ {hi})", bind)


def ldexp(x: str, e: str, dt: DType, bind: Bind) -> str:
    """``x * 2^e`` (``e`` an int64) rounded once to ``dt`` (see semantics.ldexp)."""
    k = bind("int64_t", e)
    if dt.name == "f32":
        kc = bind("int64_t", f"hp_sel_i64({k} < -300, -300, hp_sel_i64({k} > 300, 300, {k}))")
        return f"((float)((double)({x}) * {_pow2(kc)}))"
    y = bind("double", x)
    for _ in range(2):
        step = bind("int64_t", f"hp_sel_i64({k} > 1023, 1023, hp_sel_i64({k} < -1022, -969, 0))")
        y = bind("double", f"{y} * {_pow2(step)}")
        k = bind("int64_t", f"{k} - {step}")
    kc = bind("int64_t", f"hp_sel_i64({k} < -1022, -1022, hp_sel_i64({k} > 1023, 1023, {k}))")
    return f"({y} * {_pow2(kc)})"
