"""The CompLL IR: the one description of an algorithm that every backend consumes.

An algorithm is a :class:`Program` specialised to concrete hyper-parameter values. Its
``encode`` and ``decode`` are straight-line lists of host operations (:data:`Op`) over SSA names:

- host scalars (:class:`Let`),
- data-parallel array operations (:class:`Map`, :class:`Reduce`, :class:`Filter`, :class:`TopK`,
  :class:`Sort`, :class:`Scan`, :class:`Scatter`) whose per-element work is a :class:`Lambda`,
- writes of new values to declared state (:class:`StoreState`).

Scalar expressions (:data:`Expr`) are trees; lambdas are SSA ``lets`` plus a result. Array
lengths are expressions over ``Ref("n", i64)`` and constants only. Every name is unique in a
program. The reference interpreter (:mod:`hipress.compll.ir.interp`) defines what each node computes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Union

from hipress.compll.ir import ops
from hipress.compll.ir.types import ArrayType, DType, MatMul

# ---------------------------------------------------------------- scalar expressions


class _Shown:
    """``str()`` of a scalar expression is its source-like text (:func:`show_expr`)."""

    __slots__ = ()

    def __str__(self) -> str:
        return show_expr(self)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Const(_Shown):
    value: int | float | bool
    dtype: DType


@dataclass(frozen=True)
class Ref(_Shown):
    """A scalar SSA value: host scalar, lambda parameter/local, or ``n``."""

    name: str
    dtype: DType


@dataclass(frozen=True)
class Load(_Shown):
    """``array[index]``; an index outside ``[0, len)`` reads 0."""

    array: str
    index: Expr
    dtype: DType


@dataclass(frozen=True)
class Unary(_Shown):
    op: str  # a name in hipress.compll.ir.ops.UNARY
    x: Expr
    dtype: DType


@dataclass(frozen=True)
class Binary(_Shown):
    op: str  # a name in hipress.compll.ir.ops.BINARY
    a: Expr
    b: Expr
    dtype: DType


@dataclass(frozen=True)
class Select(_Shown):
    cond: Expr
    a: Expr
    b: Expr
    dtype: DType


@dataclass(frozen=True)
class Cast(_Shown):
    x: Expr
    dtype: DType


@dataclass(frozen=True)
class Rand(_Shown):
    """Counter-based random numbers (Philox4x32-10, see :mod:`hipress.compll.ir.rng`).

    kind "bits": u32 raw bits; "uniform": f32 in [0, 1) from the top 24 bits.
    """

    kind: str
    counter: Expr
    stream: int
    dtype: DType


Expr = Union[Const, Ref, Load, Unary, Binary, Select, Cast, Rand]


@dataclass(frozen=True)
class Lambda:
    """Per-element (or combiner) code: SSA ``lets`` then ``result``."""

    params: tuple[Ref, ...]
    lets: tuple[tuple[str, Expr], ...]
    result: Expr


# ---------------------------------------------------------------- host operations


@dataclass(frozen=True)
class Let:
    name: str
    value: Expr


@dataclass(frozen=True)
class Map:
    """``name[i] = fn(i)`` for i in [0, type.length); packed arrays keep the low ``bits``."""

    name: str
    type: ArrayType
    fn: Lambda


@dataclass(frozen=True)
class Reduce:
    """Reduce ``fn(i)`` over [0, length) with ``op``.

    ops: sum (floats accumulate in f64, result rounded to the element type; ints in i64),
    min/max (NaN-propagating, -0 < +0), absmax, any, all, count, or "custom" with
    ``combine(a, b)`` and ``init``.
    """

    name: str
    op: str
    length: Expr
    fn: Lambda
    dtype: DType
    combine: Lambda | None = None
    init: Expr | None = None


@dataclass(frozen=True)
class SegReduce:
    """Reduce ``fn(i)`` over consecutive segments of ``seg`` elements of [0, length): element s
    of the result reduces [s*seg, min((s+1)*seg, length)); ``ceil(length/seg)`` results. ops as
    :class:`Reduce` except "custom". ``matmul``: the sum is a matrix product of that shape."""

    name: str
    op: str
    length: Expr
    seg: Expr
    fn: Lambda
    dtype: DType
    matmul: MatMul | None = None


@dataclass(frozen=True)
class Filter:
    """Indices i (ascending) with ``pred(i)``; first ``bound`` kept, rest of idx zero.

    ``count`` = number kept = min(#true, bound)."""

    idx: str
    count: str
    length: Expr
    bound: Expr
    pred: Lambda


@dataclass(frozen=True)
class TopK:
    """Indices of the ``k`` largest ``key(i)`` (NaN largest, ties to the lower index), in
    ascending index order; ``count`` = min(k, length), idx beyond count zero."""

    idx: str
    count: str
    length: Expr
    k: Expr
    key: Lambda


@dataclass(frozen=True)
class Sort:
    """Values ``key(i)`` sorted ascending (NaN last)."""

    name: str
    length: Expr
    key: Lambda
    dtype: DType


@dataclass(frozen=True)
class Scan:
    """Inclusive prefix ``op`` (sum, min, max) of ``fn(i)``; float sums accumulate in f64."""

    name: str
    op: str
    length: Expr
    fn: Lambda
    dtype: DType


@dataclass(frozen=True)
class Scatter:
    """``name = base`` (or zeros of ``length``) then, in ascending j < count,
    ``name[idx[j]] += vals[j]`` (``mode`` "add") or ``name[idx[j]] = vals[j]`` ("set": the
    last j at an index wins); indices outside [0, length) are ignored."""

    name: str
    length: Expr
    base: str | None
    idx: str
    vals: str
    count: Expr
    dtype: DType
    mode: str = "add"


@dataclass(frozen=True)
class StoreState:
    """Make ``value`` (an array SSA name or a scalar expression) the new value of state
    ``state``; takes effect when encode finishes."""

    state: str
    value: str | Expr


@dataclass(frozen=True)
class Block:
    """Block-local ops (a ``block(size) { ... }`` section): ``ops`` are Maps of ``length``
    elements and SegReduces over them with ``size``-element segments. Their lambdas read the
    section's own arrays through masked indices (a read outside the element's aligned block of
    ``size`` reads 0), so running ``ops`` in order is the definition; a target may run them
    block by block, each block in cache."""

    size: int
    length: Expr
    ops: tuple[Op, ...]


Op = Union[Let, Map, Reduce, SegReduce, Filter, TopK, Sort, Scan, Scatter, StoreState, Block]


@dataclass(frozen=True)
class Slot:
    """A declared state entry or payload field: an array, or a scalar when ``type`` is DType."""

    name: str
    type: ArrayType | DType


@dataclass(frozen=True)
class Encode:
    grad: str  # input array name, f32[n]
    ops: tuple[Op, ...]
    fields: tuple[str | Expr, ...]  # one per payload field: array SSA name or scalar expr


@dataclass(frozen=True)
class Decode:
    payload: str  # field f is bound as "<payload>.<f>"
    ops: tuple[Op, ...]
    result: str  # array SSA name, f32[n]


@dataclass(frozen=True)
class Program:
    name: str
    doc: str
    params: tuple[tuple[str, int | float | bool], ...]
    state: tuple[Slot, ...]
    payload: tuple[Slot, ...]
    encode: Encode
    decode: Decode

    def digest(self) -> str:
        """Content hash of the specialised program (names, params, ops; no source spans)."""
        return hashlib.sha256(repr(self).encode()).hexdigest()

    @property
    def uses_random(self) -> bool:
        return "Rand(" in repr(self.encode)


N = "n"

# ---------------------------------------------------------------- printing


def show_expr(e: Expr) -> str:
    """Render an expression in a compact C-like form (for ``hipress show --ir``)."""
    if isinstance(e, Const):
        v = e.value
        if isinstance(v, bool):
            return "true" if v else "false"
        return repr(v) if e.dtype.is_float else str(v)
    if isinstance(e, Ref):
        return e.name
    if isinstance(e, Load):
        return f"{e.array}[{show_expr(e.index)}]"
    if isinstance(e, Unary):
        sym = ops.UNARY[e.op].symbol
        return f"{sym}{show_expr(e.x)}" if sym else f"{e.op}({show_expr(e.x)})"
    if isinstance(e, Binary):
        sym = ops.BINARY[e.op].symbol
        if sym:
            return f"({show_expr(e.a)} {sym} {show_expr(e.b)})"
        return f"{e.op}({show_expr(e.a)}, {show_expr(e.b)})"
    if isinstance(e, Select):
        return f"({show_expr(e.cond)} ? {show_expr(e.a)} : {show_expr(e.b)})"
    if isinstance(e, Cast):
        return f"{e.dtype}({show_expr(e.x)})"
    if isinstance(e, Rand):
        return f"rand_{e.kind}({show_expr(e.counter)}, stream={e.stream})"
    raise TypeError(e)
