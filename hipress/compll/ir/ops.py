"""The operation table: every scalar and reduction operation of the IR, named once.

Each :class:`OpDef` says what the stages need to know about one operation:

- ``name``: what :class:`~hipress.compll.ir.nodes.Unary`, ``Binary``, ``Reduce``, ``SegReduce``
  and ``Scan`` nodes store in ``op`` (the IR holds the string; this table is its meaning);
- ``kind`` and ``arity``: unary (1 operand), binary (2) or reduce (1 value per element);
- ``operands``: the typing rule for the operands (one of the rule constants below), from which
  ``ints`` / ``floats`` / ``bools`` say which operands are accepted and ``accepts(dtype)``
  checks one;
- ``result``: the result type, :data:`SAME` (the operand type), :data:`WIDEN` (integers to i64,
  floats unchanged) or a scalar type's name; ``result_type(dtype)`` applies it;
- ``symbol``: the operator as the language and ``show_expr`` write it (``+``, ``!``), or None
  when it is written as a call ``name(...)``;
- ``builtin``: whether the language has a builtin function of this name (``abs(x)``,
  ``min(a, b)``, ``ldexp(x, e)``); ``named``: whether a reduce or scan names it as its
  operator (``reduce(sum, a)``); ``scan``: whether ``scan`` accepts it; ``combiner``: the
  binary operation that joins two partial results of a reduction.

What each operation computes is :mod:`hipress.compll.ir.semantics`, which implements every
unary and binary entry here by name (the reductions are in :mod:`hipress.compll.ir.interp`).
"""

from __future__ import annotations

from dataclasses import dataclass

from hipress.compll.ir.types import I64, SCALAR_TYPES, DType

# ---------------------------------------------------------------- operand typing rules

NUMBER = "number"  # integers or floats (two operands are unified first)
INT = "int"  # integers
BOOLS = "bool"  # bools
FLOAT = "float"  # floats; an untyped literal operand becomes f32
INT_OR_BOOL = "int_or_bool"  # integers or bools (bitwise operators)
EQUALITY = "equality"  # any two operands of one type, bools included
ORDERED = "ordered"  # two operands of one type, not bools
UNIFIED = "unified"  # two operands of one type, nothing more asked (min, max)
SHIFT = "shift"  # integers; the count is converted to the left operand's type
BITS = "bits"  # a value of the result's width (bit casts)
FLOAT_EXP = "float_exp"  # a float and an integer exponent, taken as i64 (ldexp)
COMBINE = "combine"  # a user combiner (a reduce with a lambda)

# (integers, floats, bools) accepted by each rule
_CLASSES: dict[str, tuple[bool, bool, bool]] = {
    NUMBER: (True, True, False),
    INT: (True, False, False),
    BOOLS: (False, False, True),
    FLOAT: (False, True, False),
    INT_OR_BOOL: (True, False, True),
    EQUALITY: (True, True, True),
    ORDERED: (True, True, False),
    UNIFIED: (True, True, True),
    SHIFT: (True, False, False),
    BITS: (True, True, False),
    FLOAT_EXP: (False, True, False),
    COMBINE: (True, True, True),
}

# ---------------------------------------------------------------- result rules

SAME = "same"  # the operand type (the left operand's for a binary operation)
WIDEN = "widen"  # integers accumulate and result in i64, floats keep their type


@dataclass(frozen=True)
class OpDef:
    """One operation; see the module docstring for the fields."""

    name: str
    kind: str  # "unary" | "binary" | "reduce"
    operands: str
    result: str
    symbol: str | None = None
    builtin: bool = False
    named: bool = True
    scan: bool = False
    combiner: str | None = None  # a reduction: the binary operation joining partial results

    @property
    def arity(self) -> int:
        return 2 if self.kind == "binary" else 1

    @property
    def ints(self) -> bool:
        """Whether integer operands are accepted."""
        return _CLASSES[self.operands][0]

    @property
    def floats(self) -> bool:
        """Whether float operands are accepted."""
        return _CLASSES[self.operands][1]

    @property
    def bools(self) -> bool:
        """Whether bool operands are accepted."""
        return _CLASSES[self.operands][2]

    def accepts(self, operand: DType) -> bool:
        """Whether an operand of type ``operand`` meets the rule (for two operands, after they
        are unified; a bit cast also needs the result's width, ldexp an integer exponent)."""
        ints, floats, bools = _CLASSES[self.operands]
        return (
            (ints and operand.is_int)
            or (floats and operand.is_float)
            or (bools and operand.is_bool)
        )

    def result_type(self, operand: DType) -> DType:
        """The result type for operands of type ``operand`` (already checked against the rule)."""
        if self.result == SAME:
            return operand
        if self.result == WIDEN:
            return I64 if operand.is_int else operand
        return SCALAR_TYPES[self.result]


def _u(name: str, operands: str, result: str = SAME, symbol: str | None = None) -> OpDef:
    return OpDef(name, "unary", operands, result, symbol, builtin=symbol is None)


def _b(name: str, operands: str, result: str = SAME, symbol: str | None = None) -> OpDef:
    return OpDef(name, "binary", operands, result, symbol, builtin=symbol is None)


def _r(
    name: str,
    operands: str,
    result: str,
    combiner: OpDef | None,
    scan: bool = False,
    named: bool = True,
) -> OpDef:
    join = combiner.name if combiner is not None else None
    return OpDef(name, "reduce", operands, result, scan=scan, named=named, combiner=join)


# ---------------------------------------------------------------- unary

NEG = _u("neg", NUMBER, symbol="-")
NOT = _u("not", BOOLS, symbol="!")
BNOT = _u("bnot", INT, symbol="~")
ABS = _u("abs", NUMBER)
FLOOR = _u("floor", FLOAT)
CEIL = _u("ceil", FLOAT)
ROUND = _u("round", FLOAT)  # half to even
TRUNC = _u("trunc", FLOAT)
SQRT = _u("sqrt", FLOAT)
SIGN = _u("sign", NUMBER)
ISNAN = _u("isnan", FLOAT, "bool")
ISINF = _u("isinf", FLOAT, "bool")
ISFINITE = _u("isfinite", FLOAT, "bool")
AS_U32 = _u("as_u32", BITS, "u32")
AS_I32 = _u("as_i32", BITS, "i32")
AS_F32 = _u("as_f32", BITS, "f32")
AS_I64 = _u("as_i64", BITS, "i64")
AS_F64 = _u("as_f64", BITS, "f64")
EXPONENT = _u("exponent", FLOAT, "i32")

# ---------------------------------------------------------------- binary

ADD = _b("add", NUMBER, symbol="+")
SUB = _b("sub", NUMBER, symbol="-")
MUL = _b("mul", NUMBER, symbol="*")
DIV = _b("div", NUMBER, symbol="/")
MOD = _b("mod", NUMBER, symbol="%")
SHL = _b("shl", SHIFT, symbol="<<")
SHR = _b("shr", SHIFT, symbol=">>")
BAND = _b("band", INT_OR_BOOL, symbol="&")
BOR = _b("bor", INT_OR_BOOL, symbol="|")
BXOR = _b("bxor", INT_OR_BOOL, symbol="^")
AND = _b("and", BOOLS, "bool", "&&")
OR = _b("or", BOOLS, "bool", "||")
EQ = _b("eq", EQUALITY, "bool", "==")
NE = _b("ne", EQUALITY, "bool", "!=")
LT = _b("lt", ORDERED, "bool", "<")
LE = _b("le", ORDERED, "bool", "<=")
GT = _b("gt", ORDERED, "bool", ">")
GE = _b("ge", ORDERED, "bool", ">=")
MIN = _b("min", UNIFIED)  # NaN-propagating, -0 < +0
MAX = _b("max", UNIFIED)
LDEXP = _b("ldexp", FLOAT_EXP)
HASH = _b("hash", INT, "u32")  # seed and counter, each taken as i64 (see semantics.hash32)

# ---------------------------------------------------------------- reductions (and scans)

REDUCE_SUM = _r("sum", NUMBER, WIDEN, ADD, scan=True)  # floats accumulate in f64
REDUCE_MIN = _r("min", NUMBER, SAME, MIN, scan=True)
REDUCE_MAX = _r("max", NUMBER, SAME, MAX, scan=True)
REDUCE_ABSMAX = _r("absmax", NUMBER, SAME, MAX)  # of the absolute values
REDUCE_ANY = _r("any", BOOLS, "bool", OR)
REDUCE_ALL = _r("all", BOOLS, "bool", AND)
REDUCE_COUNT = _r("count", BOOLS, "i64", ADD)  # of the true values
# reduce((a, b) => ..., init, xs): the user's lambda combines
REDUCE_CUSTOM = _r("custom", COMBINE, SAME, None, named=False)

# ---------------------------------------------------------------- indexes

UNARY: dict[str, OpDef] = {
    o.name: o
    for o in (NEG, NOT, BNOT, ABS, FLOOR, CEIL, ROUND, TRUNC, SQRT, SIGN, ISNAN, ISINF,
              ISFINITE, AS_U32, AS_I32, AS_F32, AS_I64, AS_F64, EXPONENT)
}  # fmt: skip
BINARY: dict[str, OpDef] = {
    o.name: o
    for o in (ADD, SUB, MUL, DIV, MOD, SHL, SHR, BAND, BOR, BXOR, AND, OR, EQ, NE, LT, LE, GT,
              GE, MIN, MAX, LDEXP, HASH)
}  # fmt: skip
REDUCE: dict[str, OpDef] = {
    o.name: o
    for o in (REDUCE_SUM, REDUCE_MIN, REDUCE_MAX, REDUCE_ABSMAX, REDUCE_ANY, REDUCE_ALL,
              REDUCE_COUNT, REDUCE_CUSTOM)
}  # fmt: skip

# the language's operators: source symbol -> operation
UNARY_SYMBOLS: dict[str, OpDef] = {o.symbol: o for o in UNARY.values() if o.symbol}
BINARY_SYMBOLS: dict[str, OpDef] = {o.symbol: o for o in BINARY.values() if o.symbol}
# names of the operators a reduce / segreduce / scan takes first, in the order errors list them
REDUCE_OPS: tuple[str, ...] = tuple(o.name for o in REDUCE.values() if o.named)
SCAN_OPS: tuple[str, ...] = tuple(o.name for o in REDUCE.values() if o.scan)
# comparisons (bool result from operands of one type)
COMPARISONS: tuple[str, ...] = tuple(
    o.name for o in BINARY.values() if o.operands in (EQUALITY, ORDERED)
)
# unary builtins over numbers and floats (``abs(x)``, ``isnan(x)``), the bit casts
# (``as_u32(x)``) and ``exponent(x)``
MATH_BUILTINS: tuple[str, ...] = tuple(
    o.name for o in UNARY.values() if o.builtin and o.operands in (NUMBER, FLOAT)
    and o.result in (SAME, "bool")
)  # fmt: skip
BIT_CASTS: tuple[str, ...] = tuple(o.name for o in UNARY.values() if o.operands == BITS)
