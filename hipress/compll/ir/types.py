"""CompLL value types: scalar dtypes and (possibly bit-packed) array types.

Sizes of arrays are IR expressions over the element count ``n`` (see :mod:`hipress.compll.ir.nodes`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class DType:
    """A scalar type. ``bits`` is the storage width; f16/bf16/f8e4m3/f8e5m2 are storage-only
    types."""

    name: str
    kind: str  # "bool" | "int" | "uint" | "float"
    bits: int

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        return self.kind in ("int", "uint")

    @property
    def is_signed(self) -> bool:
        return self.kind == "int"

    @property
    def is_bool(self) -> bool:
        return self.kind == "bool"

    @property
    def nbytes(self) -> int:
        return max(1, self.bits // 8)

    @property
    def storage_only(self) -> bool:
        """f16, bf16 and the fp8 types can be stored and converted, not computed with."""
        return self.name in STORAGE_FLOATS

    def __str__(self) -> str:
        return self.name


BOOL = DType("bool", "bool", 8)
U8 = DType("u8", "uint", 8)
U16 = DType("u16", "uint", 16)
U32 = DType("u32", "uint", 32)
I8 = DType("i8", "int", 8)
I16 = DType("i16", "int", 16)
I32 = DType("i32", "int", 32)
I64 = DType("i64", "int", 64)
F16 = DType("f16", "float", 16)
BF16 = DType("bf16", "float", 16)
F8E4M3 = DType("f8e4m3", "float", 8)  # torch.float8_e4m3fn: no inf, saturates at 448
F8E5M2 = DType("f8e5m2", "float", 8)  # torch.float8_e5m2
STORAGE_FLOATS = ("f16", "bf16", F8E4M3.name, F8E5M2.name)
F32 = DType("f32", "float", 32)
F64 = DType("f64", "float", 64)

SCALAR_TYPES: dict[str, DType] = {
    t.name: t for t in (BOOL, U8, U16, U32, I8, I16, I32, I64, F16, BF16, F8E4M3, F8E5M2, F32, F64)
}
PARAM_TYPES = ("bool", "i32", "i64", "u32", "f32", "f64")
PACKED_BITS = (1, 2, 4, 8)

# The reference interpreter keeps every integer type in int64 (wrapped to its width after each
# operation) because torch lacks arithmetic on most unsigned types.
_TORCH = {
    "bool": torch.bool,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "f8e4m3": torch.float8_e4m3fn,
    "f8e5m2": torch.float8_e5m2,
    "f32": torch.float32,
    "f64": torch.float64,
}


def torch_compute_dtype(t: DType) -> torch.dtype:
    """The torch dtype the reference interpreter computes ``t`` in."""
    return _TORCH.get(t.name, torch.int64)


def torch_storage_dtype(t: DType) -> torch.dtype:
    """The torch dtype with ``t``'s exact storage layout (for payload bytes)."""
    return {
        "u8": torch.uint8,
        "i8": torch.int8,
        "u16": torch.uint16,
        "i16": torch.int16,
        "u32": torch.uint32,
        "i32": torch.int32,
        "i64": torch.int64,
    }.get(t.name) or _TORCH[t.name]


class SizeExpr(Protocol):
    """What an array length is: an IR scalar expression (any node of
    :data:`hipress.compll.ir.nodes.Expr`), typed here by the one attribute every node has, so
    that this module needs nothing of the IR's nodes."""

    @property
    def dtype(self) -> DType: ...


@dataclass(frozen=True)
class ArrayType:
    """A 1-D array of ``dtype`` with ``length`` elements (an IR size expression of ``n``).

    ``bits`` is set for packed unsigned arrays (``uint<bits>[len]``, dtype u8): element j
    occupies bits ``(j % (8/bits)) * bits`` upwards (LSB first) of byte ``j // (8/bits)``.
    """

    dtype: DType
    length: SizeExpr
    bits: int | None = None

    def describe(self) -> str:
        """The type as the language writes it; the length is shown by the IR node's ``str``."""
        if self.bits is not None:
            return f"uint<{self.bits}>[{self.length}]"
        return f"{self.dtype}[{self.length}]"


@dataclass(frozen=True)
class MatMul:
    """The shape of a ``matmul`` (``at``: ``matmul_at``): the f32 arrays ``a`` and ``b`` and
    the sizes ``m``, ``k``, ``r`` of C (m x r) = A (m x k, or k x m when ``at``) B (k x r), all
    row-major. It rides on the :class:`~hipress.compll.ir.nodes.SegReduce` that defines it, for
    backends with a kernel."""

    a: str
    b: str
    m: SizeExpr
    k: SizeExpr
    r: SizeExpr
    at: bool
