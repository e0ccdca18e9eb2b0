"""Scalar semantics of every IR operation, as torch functions on tensors.

This module is the executable definition of what each operation computes, shared by the
reference interpreter and the checker's constant folding. Native backends must reproduce it
bit for bit (the tests hold them to it). Rules that differ from plain C or torch:

- Integers are computed in int64 and wrapped to their width after every operation.
- Integer division and remainder truncate toward zero; by zero they give 0.
- Shift counts are taken modulo the width of the left operand.
- Float -> integer conversion truncates and saturates; NaN converts to 0.
- min/max propagate NaN and order -0 below +0, so the result never depends on operand order.
- sign(x) is -1, 0 or 1 (+0 for both zeros); NaN stays NaN.
- round() rounds half to even.
- Bit casts (as_u32 as_i32 as_i64 of a float) give every NaN the bits of the positive quiet
  NaN, as payloads store it: how a NaN was made (0/0 is 0xFFC00000 on x86, 0x7FFFFFFF on a GPU)
  is never observable. as_f32 / as_f64 reinterpret any bits as they are.
- exponent(x) is floor(log2|x|) for finite nonzero x (subnormals included), one below the
  smallest subnormal's for +-0 and one above the largest finite's for +-Inf and NaN.
- ldexp(x, e) is x * 2^e rounded once (to nearest even), through subnormals and overflow.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hipress.compll.ir import ops
from hipress.compll.ir.types import I32, DType, torch_compute_dtype


def wrap(t: torch.Tensor, dt: DType) -> torch.Tensor:
    """Wrap int64 values to the range of integer type ``dt`` (no-op otherwise)."""
    if not dt.is_int or dt.bits == 64:
        return t
    mask = (1 << dt.bits) - 1
    if dt.is_signed:
        half = 1 << (dt.bits - 1)
        return ((t + half) & mask) - half
    return t & mask


def int_range(dt: DType) -> tuple[int, int]:
    if dt.is_signed:
        return -(1 << (dt.bits - 1)), (1 << (dt.bits - 1)) - 1
    return 0, (1 << dt.bits) - 1


def const(value: int | float | bool, dt: DType, device: torch.device | None = None) -> torch.Tensor:
    """A 0-d tensor holding ``value`` as type ``dt`` (ints wrapped)."""
    if dt.is_int:
        return wrap(torch.tensor(int(value), dtype=torch.int64, device=device), dt)
    return torch.tensor(value, dtype=torch_compute_dtype(dt), device=device)


def cast(x: torch.Tensor, src: DType, dst: DType) -> torch.Tensor:
    """Convert ``x`` of type ``src`` to ``dst`` (see module rules)."""
    if src == dst:
        return x
    if dst.is_bool:
        return x != 0
    if src.is_bool:
        return x.to(torch_compute_dtype(dst))
    if dst.is_int:
        if src.is_int:
            return wrap(x, dst)
        lo, hi = int_range(dst)
        xd = x.to(torch.float64)
        t = torch.trunc(xd)
        t = torch.where(torch.isnan(t), torch.zeros_like(t), t)
        over = t >= float(hi) + 1.0 if dst.bits < 64 else t >= 9223372036854775808.0
        under = t < float(lo)
        safe = torch.where(over | under, torch.zeros_like(t), t).to(torch.int64)
        out = torch.where(over, torch.full_like(safe, hi), safe)
        return torch.where(under, torch.full_like(safe, lo), out)
    # dst is float
    if dst.bits == 8:  # fp8: from f32, as the C-family targets convert
        return x.to(torch.float32).to(torch_compute_dtype(dst))
    if src.is_int:
        return x.to(torch_compute_dtype(dst))
    return x.to(torch_compute_dtype(dst))


def _signbit(x: torch.Tensor) -> torch.Tensor:
    return torch.signbit(x)


def fmin(a: torch.Tensor, b: torch.Tensor, dt: DType) -> torch.Tensor:
    if not dt.is_float:
        return torch.where(b < a, b, a)
    pick_b = (b < a) | ((b == a) & _signbit(b)) | torch.isnan(b)
    out = torch.where(pick_b, b, a)
    return torch.where(torch.isnan(a), a, out)


def fmax(a: torch.Tensor, b: torch.Tensor, dt: DType) -> torch.Tensor:
    if not dt.is_float:
        return torch.where(b > a, b, a)
    pick_b = (b > a) | ((b == a) & ~_signbit(b)) | torch.isnan(b)
    out = torch.where(pick_b, b, a)
    return torch.where(torch.isnan(a), a, out)


def _neg(x: torch.Tensor, dt: DType) -> torch.Tensor:
    return wrap(-x, dt) if dt.is_int else -x


def _abs(x: torch.Tensor, dt: DType) -> torch.Tensor:
    return wrap(torch.abs(x), dt) if dt.is_int else torch.abs(x)


def _sign(x: torch.Tensor, dt: DType) -> torch.Tensor:
    if dt.is_int:
        return (x > 0).to(torch.int64) - (x < 0).to(torch.int64)
    s = (x > 0).to(x.dtype) - (x < 0).to(x.dtype)
    return torch.where(torch.isnan(x), x, s)


def _bits_of(x: torch.Tensor, dt: DType) -> torch.Tensor:
    """The bits of float ``x`` as int64, every NaN canonical (as_i32, as_i64)."""
    bits = x.view(_SAME_WIDTH_INT[dt.bits]).to(torch.int64)
    return torch.where(torch.isnan(x), torch.full_like(bits, CANONICAL_NAN_BITS[dt.name]), bits)


_Unary = Callable[[torch.Tensor, DType], torch.Tensor]
# every operation of ops.UNARY, by name; ``dt`` is the operand type
_UNARY: dict[str, _Unary] = {
    ops.NEG.name: _neg,
    ops.NOT.name: lambda x, dt: ~x,
    ops.BNOT.name: lambda x, dt: wrap(~x, dt),
    ops.ABS.name: _abs,
    ops.FLOOR.name: lambda x, dt: torch.floor(x),
    ops.CEIL.name: lambda x, dt: torch.ceil(x),
    ops.ROUND.name: lambda x, dt: torch.round(x),
    ops.TRUNC.name: lambda x, dt: torch.trunc(x),
    ops.SQRT.name: lambda x, dt: torch.sqrt(x),
    ops.SIGN.name: _sign,
    ops.ISNAN.name: lambda x, dt: torch.isnan(x),
    ops.ISINF.name: lambda x, dt: torch.isinf(x),
    ops.ISFINITE.name: lambda x, dt: torch.isfinite(x),
    ops.AS_U32.name: lambda x, dt: _bits_of(x, dt) & 0xFFFFFFFF,
    ops.AS_I32.name: _bits_of,
    ops.AS_I64.name: _bits_of,
    ops.AS_F32.name: lambda x, dt: wrap(x, I32).to(torch.int32).view(torch.float32),
    ops.AS_F64.name: lambda x, dt: x.view(torch.float64),
    ops.EXPONENT.name: lambda x, dt: _exponent(x, dt),
}


def unary(op: str, x: torch.Tensor, dt: DType) -> torch.Tensor:
    """Apply unary ``op`` (a name in :data:`ops.UNARY`) to ``x`` of type ``dt`` (the operand
    type). Raises ValueError for an unknown name."""
    fn = _UNARY.get(op)
    if fn is None:
        raise ValueError(f"unknown unary op {op}")
    return fn(x, dt)


# the positive quiet NaN (payload.CANONICAL_NAN), the bits a bit cast gives every NaN
CANONICAL_NAN_BITS = {"f32": 0x7FC00000, "f64": 0x7FF8000000000000}
_SAME_WIDTH_INT = {32: torch.int32, 64: torch.int64}
# (mantissa bits, exponent bias) of the computing float types
_FORMAT = {"f32": (23, 127), "f64": (52, 1023)}


def _pow2(k: torch.Tensor) -> torch.Tensor:
    """2^k as f64, exactly, for int64 ``k`` in [-1022, 1023] (built from its bits)."""
    return ((k + 1023) << 52).view(torch.float64)


def _exponent(x: torch.Tensor, dt: DType) -> torch.Tensor:
    mant, bias = _FORMAT[dt.name]
    mag = x.view(_SAME_WIDTH_INT[dt.bits]).to(torch.int64) & ((1 << (dt.bits - 1)) - 1)
    field = mag >> mant
    # a subnormal is mag * 2^(1 - bias - mant) with mag < 2^mant, exact as an f64 whose
    # exponent field gives floor(log2 mag)
    log2_mag = (mag.to(torch.float64).view(torch.int64) >> 52) - 1023
    out = torch.where(field == 0, log2_mag - (bias + mant - 1), field - bias)
    out = torch.where(mag == 0, torch.full_like(out, -(bias + mant)), out)
    return torch.where(field == 2 * bias + 1, torch.full_like(out, bias + 1), out)


def ldexp(x: torch.Tensor, e: torch.Tensor, dt: DType) -> torch.Tensor:
    """``x * 2^e`` (``e`` int64) rounded once to ``dt``: no double rounding in the subnormal
    range, overflow to +-Inf. (torch.ldexp multiplies by a rounded 2^e, which is 0 or Inf for
    large |e| even when the product is finite.)"""
    if dt.name == "f32":
        # the f64 product is exact (|e| <= 300 keeps it normal); beyond, every nonzero finite
        # f32 overflows or rounds to zero either way
        return (x.to(torch.float64) * _pow2(e.clamp(-300, 300))).to(torch.float32)
    # f64: up to two scalings towards the range (by 2^1023 or 2^-969), then the one rounding
    # multiplication. A scaling down is inexact only when |x| < 2^-53, and then the result is
    # below half the smallest subnormal both ways: zero (as in musl's scalbn)
    y, k = x, e
    for _ in range(2):
        step = torch.where(k > 1023, 1023, torch.where(k < -1022, -969, 0))
        y = y * _pow2(step)
        k = k - step
    return y * _pow2(k.clamp(-1022, 1023))


_INT64_MIN = -(1 << 63)


def _int_div_mod(op: str, a: torch.Tensor, b: torch.Tensor, dt: DType) -> torch.Tensor:
    """Integer division / remainder: truncating, 0 for a zero divisor, no overflow trap."""
    a, b = torch.broadcast_tensors(a, b)
    zero = b == 0
    ovf = (a == _INT64_MIN) & (b == -1)
    bs = torch.where(zero | ovf, torch.ones_like(b), b)
    if op == ops.DIV.name:
        r = torch.where(ovf, a, torch.div(a, bs, rounding_mode="trunc"))
    else:
        r = torch.where(ovf, torch.zeros_like(a), torch.fmod(a, bs))
    return wrap(torch.where(zero, torch.zeros_like(r), r), dt)


def _div(a: torch.Tensor, b: torch.Tensor, dt: DType) -> torch.Tensor:
    return _int_div_mod(ops.DIV.name, a, b, dt) if dt.is_int else a / b


def _mod(a: torch.Tensor, b: torch.Tensor, dt: DType) -> torch.Tensor:
    return _int_div_mod(ops.MOD.name, a, b, dt) if dt.is_int else torch.fmod(a, b)


_Binary = Callable[[torch.Tensor, torch.Tensor, DType], torch.Tensor]


def _wrapped(f: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> _Binary:
    """``f`` computed in int64 and wrapped to the operand type (unchanged for others)."""
    return lambda a, b, dt: wrap(f(a, b), dt) if dt.is_int else f(a, b)


# every operation of ops.BINARY, by name; ``dt`` is the (left) operand type
_BINARY: dict[str, _Binary] = {
    ops.ADD.name: _wrapped(lambda a, b: a + b),
    ops.SUB.name: _wrapped(lambda a, b: a - b),
    ops.MUL.name: _wrapped(lambda a, b: a * b),
    ops.DIV.name: _div,
    ops.MOD.name: _mod,
    ops.SHL.name: lambda a, b, dt: wrap(a << (b & (dt.bits - 1)), dt),
    ops.SHR.name: lambda a, b, dt: wrap(a >> (b & (dt.bits - 1)), dt),
    ops.BAND.name: _wrapped(lambda a, b: a & b),
    ops.BOR.name: _wrapped(lambda a, b: a | b),
    ops.BXOR.name: _wrapped(lambda a, b: a ^ b),
    ops.AND.name: lambda a, b, dt: a & b,
    ops.OR.name: lambda a, b, dt: a | b,
    ops.EQ.name: lambda a, b, dt: a == b,
    ops.NE.name: lambda a, b, dt: a != b,
    ops.LT.name: lambda a, b, dt: a < b,
    ops.LE.name: lambda a, b, dt: a <= b,
    ops.GT.name: lambda a, b, dt: a > b,
    ops.GE.name: lambda a, b, dt: a >= b,
    ops.MIN.name: fmin,
    ops.MAX.name: fmax,
    ops.LDEXP.name: ldexp,
    ops.HASH.name: lambda a, b, dt: hash32(a, b),
}


HASH_SALT = 0x9E3779B9
FMIX_M1, FMIX_M2 = 0x85EBCA6B, 0xC2B2AE35
_M32 = 0xFFFFFFFF


def fmix32(h: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finaliser of ``h`` (int64 values in [0, 2**32)), mod 2**32."""
    h = h ^ (h >> 16)
    h = (h * FMIX_M1) & _M32  # (the product fits in 64 bits: int64 keeps its low bits)
    h = h ^ (h >> 13)
    h = (h * FMIX_M2) & _M32
    return h ^ (h >> 16)


def hash32(seed: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    """``hash(seed, i)``: with lo/hi the low and high 32 bits of a value as an i64,
    ``fmix32(fmix32(fmix32(fmix32(lo(seed) ^ 0x9E3779B9) ^ hi(seed)) ^ lo(i)) ^ hi(i))``,
    a u32 (as int64). For one seed, distinct i below 2**32 give distinct hashes."""
    s, c = seed.to(torch.int64), i.to(torch.int64)
    h = fmix32((s & _M32) ^ HASH_SALT)
    h = fmix32(h ^ ((s >> 32) & _M32))
    h = fmix32(h ^ (c & _M32))
    return fmix32(h ^ ((c >> 32) & _M32))


def binary(op: str, a: torch.Tensor, b: torch.Tensor, dt: DType) -> torch.Tensor:
    """Apply binary ``op`` (a name in :data:`ops.BINARY`); ``dt`` is the operand type
    (comparisons return bool). Raises ValueError for an unknown name."""
    fn = _BINARY.get(op)
    if fn is None:
        raise ValueError(f"unknown binary op {op}")
    return fn(a, b, dt)


def order_key(x: torch.Tensor, dt: DType) -> torch.Tensor:
    """An int64 key giving the total order used by sort and topk.

    Floats: -inf < ... < -0 < +0 < ... < +inf < NaN (every NaN equal). Integers: their value.
    """
    if not dt.is_float:
        return x.to(torch.int64)
    f = x.to(torch.float64)  # exact for f16/bf16/f32
    bits = f.view(torch.int64)
    # positive floats: bits increase with value; negative: key = -magnitude - 1 (-0 -> -1).
    key = torch.where(bits < 0, -(bits & ((1 << 63) - 1)) - 1, bits)
    return torch.where(torch.isnan(f), torch.full_like(key, (1 << 63) - 1), key)
