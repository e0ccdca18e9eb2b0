"""C spellings shared by the C-family targets (C/OpenMP and CUDA): types, literals, casts,
identifiers, and one rule per IR operation (:data:`UNARY`, :data:`BINARY`).

The rules are the C-family renderer's operation table, keyed by the names of
:mod:`hipress.compll.ir.ops`; a target that spells an operation differently overrides its
entry (:class:`~hipress.compll.backends.cfamily.expr.Emitter` reads the tables from its class). The
helpers they name (``hp_add_i32``, ``hp_min_f32``...) are defined by each target's prelude
template with the semantics of :mod:`hipress.compll.ir.semantics`.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Mapping
from types import MappingProxyType

import torch

from hipress.compll.ir import ops
from hipress.compll.ir.types import STORAGE_FLOATS, DType, torch_compute_dtype

CTYPE = {
    "bool": "bool", "u8": "uint8_t", "u16": "uint16_t", "u32": "uint32_t", "i8": "int8_t",
    "i16": "int16_t", "i32": "int32_t", "i64": "int64_t", "f16": "uint16_t", "bf16": "uint16_t",
    "f8e4m3": "uint8_t", "f8e5m2": "uint8_t", "f32": "float", "f64": "double",
}  # fmt: skip
# the element type arrays of each dtype are stored as (bool arrays are bytes)
MTYPE = {**CTYPE, "bool": "uint8_t"}

INT_TYPES = ("u8", "u16", "u32", "i8", "i16", "i32", "i64")
F32 = DType("f32", "float", 32)
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def is_ident(text: str) -> bool:
    """Whether ``text`` is a plain C identifier (safe to repeat without re-evaluating)."""
    return _IDENT.match(text) is not None


def ctype(dt: DType) -> str:
    return CTYPE[dt.name]


def mtype(dt: DType) -> str:
    return MTYPE[dt.name]


class Names:
    """An injective map from SSA names to C identifiers, plus fresh temporaries."""

    def __init__(self) -> None:
        self._map: dict[str, str] = {}
        self._used: set[str] = set()
        self._k = 0

    def get(self, name: str, prefix: str = "s") -> str:
        key = f"{prefix}:{name}"
        if key not in self._map:
            base = f"{prefix}_" + re.sub(r"\W", "_", name)
            ident = base
            k = 1
            while ident in self._used:
                ident = f"{base}_{k}"
                k += 1
            self._used.add(ident)
            self._map[key] = ident
        return self._map[key]

    def fresh(self, base: str = "v") -> str:
        self._k += 1
        return f"{base}{self._k}"


def scatter_combine(mode: str, dt: DType) -> Callable[[str, str], str]:
    """How a scatter's value joins the element it lands on (C source of the new element, from
    the old one and the value): added, or with ``mode`` "set" put in its place, so that in
    ascending j the last value at an index wins."""
    if mode == "set":
        return lambda old, v: v
    if dt.is_float:
        return lambda old, v: f"({old} + {v})"
    return lambda old, v: f"hp_add_{dt.name}({old}, {v})"


def const(value: int | float | bool, dt: DType) -> str:
    """A C literal of exactly ``value`` as ``dt``."""
    if dt.is_bool:
        return "true" if value else "false"
    if dt.is_int:
        v = int(value)
        if dt.name == "i64":
            return "INT64_MIN" if v == -(1 << 63) else f"INT64_C({v})"
        if dt.name == "i32" and v == -(1 << 31):
            return "INT32_MIN"
        if dt.name == "u32":
            return f"UINT32_C({v})"
        return f"(({ctype(dt)}){v})"
    v = float(value)
    if dt.name in STORAGE_FLOATS:
        store = torch.tensor(v, dtype=torch.float32).to(torch_compute_dtype(dt))
        bits = int(store.view(torch.int16 if dt.bits == 16 else torch.uint8).item())
        return f"(({ctype(dt)})0x{bits & 0xFFFF:04x})"
    if dt.name == "f32":
        if v != v:
            return "hp_f32_from_bits(0x7fc00000u)"
        if v in (float("inf"), float("-inf")):
            return "HP_INF_F" if v > 0 else "(-HP_INF_F)"
        v32 = struct.unpack("<f", struct.pack("<f", v))[0]
        return f"{v32.hex()}f"
    if v != v:
        return "hp_f64_from_bits(UINT64_C(0x7ff8000000000000))"
    if v in (float("inf"), float("-inf")):
        return "HP_INF_D" if v > 0 else "(-HP_INF_D)"
    return v.hex()


def cast(x: str, src: DType, dst: DType) -> str:
    """C code converting ``x`` from ``src`` to ``dst`` with the semantics module's rules."""
    if src == dst:
        return x
    if src.name in STORAGE_FLOATS:
        return cast(f"hp_{src.name}_to_f32({x})", F32, dst)
    if dst.is_bool:
        return f"({x} != 0)"
    if dst.name in STORAGE_FLOATS:
        if src.is_float and src.name == "f32":
            return f"hp_f32_to_{dst.name}({x})"
        return f"hp_f32_to_{dst.name}({cast(x, src, F32)})"
    if dst.is_float:
        return f"(({ctype(dst)})({x}))"
    if src.is_float:
        return f"hp_{src.name}_to_{dst.name}({x})"
    return f"(({ctype(dst)})({x}))"


# ---------------------------------------------------------------- the operation table

UnaryRule = Callable[[str, DType], str]  # (operand, operand type) -> C
BinaryRule = Callable[[str, str, DType], str]  # (a, b, operand type) -> C


def _fsuf(dt: DType) -> str:
    return "f" if dt.name == "f32" else ""


def _inf(dt: DType) -> str:
    return "HP_INF_F" if dt.name == "f32" else "HP_INF_D"


def _helper1(name: str) -> UnaryRule:
    """``hp_<op>_<type>(x)``, a prelude helper."""
    return lambda x, dt: f"hp_{name}_{dt.name}({x})"


def _ints(name: str, other: UnaryRule | None = None) -> UnaryRule:
    """The prelude helper for integers; ``other`` for floats (none: not defined on them)."""

    def rule(x: str, dt: DType) -> str:
        if dt.is_int:
            return f"hp_{name}_{dt.name}({x})"
        if other is None:
            raise ValueError(f"unknown unary op {name} on {dt}")
        return other(x, dt)

    return rule


def _helper2(name: str) -> BinaryRule:
    return lambda a, b, dt: f"hp_{name}_{dt.name}({a}, {b})"


def _int_helper(name: str, other: BinaryRule | None = None) -> BinaryRule:
    """The prelude helper for integers (wrapping, total); ``other`` for floats."""

    def rule(a: str, b: str, dt: DType) -> str:
        if dt.is_int:
            return f"hp_{name}_{dt.name}({a}, {b})"
        if other is None:
            raise ValueError(f"unknown binary op {name} on {dt}")
        return other(a, b, dt)

    return rule


def _infix(sym: str) -> BinaryRule:
    return lambda a, b, dt: f"({a} {sym} {b})"


UNARY: Mapping[str, UnaryRule] = MappingProxyType({
    ops.NOT.name: lambda x, dt: f"(!{x})",
    ops.NEG.name: _ints(ops.NEG.name, lambda x, dt: f"(-{x})"),
    ops.BNOT.name: _ints(ops.BNOT.name),
    ops.ABS.name: _ints(ops.ABS.name, lambda x, dt: f"fabs{_fsuf(dt)}({x})"),
    ops.SIGN.name: _helper1(ops.SIGN.name),
    ops.ROUND.name: _helper1(ops.ROUND.name),
    ops.FLOOR.name: _helper1(ops.FLOOR.name),
    ops.CEIL.name: _helper1(ops.CEIL.name),
    ops.TRUNC.name: _helper1(ops.TRUNC.name),
    ops.ISNAN.name: lambda x, dt: f"({x} != {x})",
    ops.ISINF.name: lambda x, dt: f"(fabs{_fsuf(dt)}({x}) == {_inf(dt)})",
    ops.ISFINITE.name: lambda x, dt: f"(fabs{_fsuf(dt)}({x}) < {_inf(dt)})",
    ops.SQRT.name: lambda x, dt: f"sqrt{_fsuf(dt)}({x})",
})  # fmt: skip

BINARY: Mapping[str, BinaryRule] = MappingProxyType({
    **{o.name: _infix(o.symbol or "") for o in (ops.EQ, ops.NE, ops.LT, ops.LE, ops.GT, ops.GE)},
    ops.AND.name: lambda a, b, dt: f"((bool)({a} & {b}))",
    ops.OR.name: lambda a, b, dt: f"((bool)({a} | {b}))",
    **{o.name: (lambda s: lambda a, b, dt: f"(({ctype(dt)})({a} {s} {b}))")(o.symbol)
       for o in (ops.BAND, ops.BOR, ops.BXOR)},
    **{o.name: _int_helper(o.name, _infix(o.symbol or ""))
       for o in (ops.ADD, ops.SUB, ops.MUL, ops.DIV)},
    ops.MOD.name: _int_helper(ops.MOD.name, lambda a, b, dt: f"fmod{_fsuf(dt)}({a}, {b})"),
    ops.SHL.name: _int_helper(ops.SHL.name),
    ops.SHR.name: _int_helper(ops.SHR.name),
    ops.MIN.name: _helper2(ops.MIN.name),
    ops.MAX.name: _helper2(ops.MAX.name),
})  # fmt: skip
