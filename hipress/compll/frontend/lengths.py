"""When two array lengths (IR expressions of ``n`` and constants) agree."""

from __future__ import annotations

from hipress.compll.ir import nodes as ir
from hipress.compll.ir.interp import eval_size
from hipress.compll.ir.types import ArrayType

_PROBES = (
    *range(0, 70),
    100,
    127,
    128,
    129,
    255,
    256,
    1000,
    1023,
    1024,
    4097,
    65535,
    1 << 20,
    (1 << 20) + 3,
    12345678,
    (1 << 31) - 1,
)


def same_length(a: ir.Expr, b: ir.Expr) -> bool:
    """Whether two length expressions agree (structurally, or at every probe size n)."""
    if a == b:
        return True
    try:
        return all(eval_size(a, n) == eval_size(b, n) for n in _PROBES)
    except (RuntimeError, ValueError, OverflowError):  # pragma: no cover - defensive
        return False


def same_type(a: ArrayType, b: ArrayType) -> bool:
    """Whether two array types agree (element type, packing and length)."""
    return a.dtype == b.dtype and a.bits == b.bits and same_length(a.length, b.length)
