"""The CompLL abstract syntax tree: frozen dataclasses whose ``span`` is excluded from equality.

Built by :mod:`hipress.compll.frontend.parse`; given meaning by :mod:`hipress.compll.frontend.check`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from hipress.compll.ir.source import Span, span_field

# ---------------------------------------------------------------- expressions


@dataclass(frozen=True)
class Number:
    text: str
    is_float: bool
    span: Span = span_field()

    @property
    def value(self) -> int | float:
        if self.is_float:
            return float(self.text)
        if self.text.lower().startswith("0x"):
            return int(self.text, 16)
        # (leading zeros stripped: Python refuses to convert more than 4300 decimal digits)
        return int(self.text.lstrip("0") or "0")


@dataclass(frozen=True)
class Bool:
    value: bool
    span: Span = span_field()


@dataclass(frozen=True)
class Name:
    id: str
    span: Span = span_field()


@dataclass(frozen=True)
class Index:
    base: Expr
    index: Expr
    span: Span = span_field()


@dataclass(frozen=True)
class Field:
    base: Expr
    name: str
    span: Span = span_field()


@dataclass(frozen=True)
class Call:
    func: str
    args: tuple[Expr, ...]
    span: Span = span_field()
    func_span: Span = span_field()


@dataclass(frozen=True)
class Unary:
    op: str
    operand: Expr
    span: Span = span_field()


@dataclass(frozen=True)
class Binary:
    op: str
    left: Expr
    right: Expr
    span: Span = span_field()


@dataclass(frozen=True)
class Cond:
    cond: Expr
    then: Expr
    other: Expr
    span: Span = span_field()


@dataclass(frozen=True)
class Lambda:
    params: tuple[str, ...]
    body: Expr | Block
    span: Span = span_field()


Expr = Union[Number, Bool, Name, Index, Field, Call, Unary, Binary, Cond, Lambda]

# ---------------------------------------------------------------- types


@dataclass(frozen=True)
class ScalarTypeAnn:
    name: str
    span: Span = span_field()


@dataclass(frozen=True)
class ArrayTypeAnn:
    elem: str
    length: Expr
    span: Span = span_field()


@dataclass(frozen=True)
class PackedTypeAnn:
    bits: Expr
    length: Expr
    span: Span = span_field()


TypeAnn = Union[ScalarTypeAnn, ArrayTypeAnn, PackedTypeAnn]

# ---------------------------------------------------------------- statements


@dataclass(frozen=True)
class Let:
    name: str
    type: TypeAnn | None
    value: Expr
    span: Span = span_field()


@dataclass(frozen=True)
class LetTuple:
    names: tuple[str, ...]
    value: Expr
    span: Span = span_field()


@dataclass(frozen=True)
class VarDecl:
    name: str
    type: TypeAnn | None
    value: Expr
    span: Span = span_field()


@dataclass(frozen=True)
class Assign:
    name: str
    op: str
    value: Expr
    span: Span = span_field()


@dataclass(frozen=True)
class If:
    cond: Expr
    then: Block
    other: Block | If | None
    span: Span = span_field()


@dataclass(frozen=True)
class Return:
    value: Expr
    span: Span = span_field()


@dataclass(frozen=True)
class For:
    """``for var in range(start, stop) { body }`` (``range(stop)``: start None)."""

    var: str
    start: Expr | None
    stop: Expr
    body: Block
    span: Span = span_field()


@dataclass(frozen=True)
class BlockSection:
    """``block(size) { body }``: the body's maps run block by block (block-local reads)."""

    size: Expr
    body: Block
    span: Span = span_field()


Stmt = Union[Let, LetTuple, VarDecl, Assign, If, For, BlockSection, Return]


@dataclass(frozen=True)
class Block:
    stmts: tuple[Stmt, ...]
    span: Span = span_field()


# ---------------------------------------------------------------- declarations


@dataclass(frozen=True)
class AlgorithmDecl:
    name: str
    doc: str
    span: Span = span_field()


@dataclass(frozen=True)
class RangeConstraint:
    lo: Expr
    hi: Expr
    span: Span = span_field()


@dataclass(frozen=True)
class SetConstraint:
    values: tuple[Expr, ...]
    span: Span = span_field()


@dataclass(frozen=True)
class ParamDecl:
    name: str
    type: TypeAnn
    constraint: RangeConstraint | SetConstraint | None
    default: Expr
    span: Span = span_field()


@dataclass(frozen=True)
class ConstDecl:
    name: str
    type: TypeAnn | None
    value: Expr
    span: Span = span_field()


@dataclass(frozen=True)
class StateDecl:
    name: str
    type: TypeAnn
    span: Span = span_field()


@dataclass(frozen=True)
class FieldDecl:
    name: str
    type: TypeAnn
    span: Span = span_field()


@dataclass(frozen=True)
class PayloadDecl:
    fields: tuple[FieldDecl, ...]
    span: Span = span_field()
    name: str | None = None  # named: one round of a multi-round algorithm


@dataclass(frozen=True)
class FnParam:
    name: str
    type: TypeAnn
    span: Span = span_field()


@dataclass(frozen=True)
class FnDecl:
    name: str
    params: tuple[FnParam, ...]
    ret: TypeAnn
    body: Block
    span: Span = span_field()


@dataclass(frozen=True)
class EncodeDecl:
    arg: str
    body: Block
    span: Span = span_field()
    inputs: tuple[str, ...] = ()  # a later round's encode: the earlier rounds' payloads
    target: str | None = None  # `-> name`: the payload this encode produces


@dataclass(frozen=True)
class DecodeDecl:
    arg: str
    body: Block
    span: Span = span_field()
    inputs: tuple[str, ...] = ()  # multi-round: decode(g, p1, p2, ...), arg is the gradient


Decl = Union[
    AlgorithmDecl, ParamDecl, ConstDecl, StateDecl, PayloadDecl, FnDecl, EncodeDecl, DecodeDecl
]


@dataclass(frozen=True)
class Module:
    """One parsed ``.cll`` file: its declarations in source order."""

    decls: tuple[Decl, ...]
    span: Span = span_field()
