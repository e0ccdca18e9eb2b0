"""Elaboration of statements and expressions (used by :mod:`hipress.compll.check`).

Holds the scope machinery, constant folding and :class:`BodyChecker`, which turns the bodies of
``encode``, ``decode``, ``fn`` and lambdas into IR while checking every name and type.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

import torch

from hipress.compll import ast, ir
from hipress.compll.check_bits import BIT_BUILTINS, BitsChecker
from hipress.compll.check_expr import ExprChecker
from hipress.compll.check_par import ParallelChecker
from hipress.compll.source import CllTypeError, Span
from hipress.compll.types import BOOL, F32, I64, SCALAR_TYPES, ArrayType, DType

REDUCE_OPS = ("sum", "min", "max", "absmax", "any", "all", "count")
SCAN_OPS = ("sum", "min", "max")
MATH1 = ("abs", "floor", "ceil", "round", "trunc", "sqrt", "sign", "isnan", "isinf", "isfinite")
PARALLEL = ("map", "reduce", "segreduce", "filter", "topk", "sort", "scan", "scatter", "gather")
RANDOM = ("urand", "uniform", "randint")
BUILTINS = (*MATH1, "min", "max", "clamp", *BIT_BUILTINS, *PARALLEL, *RANDOM, "concat", "extract")
N_REF = ir.Ref(ir.N, I64)
# predeclared values (f32, adapting like float literals); they live in a scope above the
# program's, so a declaration of the same name (const, param, let, parameter) hides them
CONSTANTS = {"inf": float("inf"), "nan": float("nan")}

_BINOPS = {
    "+": "add", "-": "sub", "*": "mul", "/": "div", "%": "mod", "<<": "shl", ">>": "shr",
    "&": "band", "|": "bor", "^": "bxor", "&&": "and", "||": "or", "==": "eq", "!=": "ne",
    "<": "lt", "<=": "le", ">": "gt", ">=": "ge",
}  # fmt: skip
_CMP = ("eq", "ne", "lt", "le", "gt", "ge")


# ---------------------------------------------------------------- values in scope


@dataclass(frozen=True)
class Scalar:
    expr: ir.Expr
    lit: bool = False  # an untyped literal that adapts to the other operand

    @property
    def dtype(self) -> DType:
        return self.expr.dtype


@dataclass(frozen=True)
class Array:
    name: str
    type: ArrayType


@dataclass(frozen=True)
class Tuple_:
    items: tuple[Scalar | Array, ...]


@dataclass(frozen=True)
class Marker:
    """A name that is not a value (an operator name such as ``sum``)."""

    name: str


Value = Scalar | Array | Tuple_


@dataclass
class Binding:
    value: Value
    kind: str  # "let" | "var" | "state" | "param" | "const" | "payload" | "builtin"


class Scope:
    def __init__(self, parent: Scope | None = None, boundary: bool = False) -> None:
        self.parent = parent
        self.names: dict[str, Binding] = {}
        self.boundary = boundary  # a lambda or fn body: outer variables are read-only

    def owned_inside(self, name: str) -> bool:
        """Whether ``name`` is defined at or below the nearest boundary scope."""
        s: Scope | None = self
        while s is not None:
            if name in s.names:
                return True
            if s.boundary:
                return False
            s = s.parent
        return False

    def lookup(self, name: str) -> Binding | None:
        s: Scope | None = self
        while s is not None:
            if name in s.names:
                return s.names[name]
            s = s.parent
        return None

    def owner(self, name: str) -> Scope | None:
        s: Scope | None = self
        while s is not None:
            if name in s.names:
                return s
            s = s.parent
        return None


def constant_scope() -> Scope:
    """A scope holding :data:`CONSTANTS`, the parent of a program's top scope."""
    s = Scope()
    for name, v in CONSTANTS.items():
        s.names[name] = Binding(Scalar(ir.Const(v, F32), True), "builtin")
    return s


class _Ctx:
    """Where code is being emitted: host ops, or the lets of a lambda."""

    def __init__(self, host: bool, in_encode: bool, ops: list[Any]) -> None:
        self.host = host
        self.in_encode = in_encode
        self.ops = ops  # host: list[ir.Op]; lambda: list[tuple[str, ir.Expr]]
        self.in_branch = False  # inside an `if` branch
        self.no_parallel = False  # inside an inlined fn


# ---------------------------------------------------------------- folding


def fold(e: ir.Expr) -> ir.Expr:
    """Evaluate ``e`` if it is made only of constants; return it unchanged otherwise."""
    if isinstance(e, ir.Select) and isinstance(e.cond, ir.Const):
        return e.a if e.cond.value else e.b
    kids = _children(e)
    if not kids or not all(isinstance(k, ir.Const) for k in kids):
        return e
    from hipress.compll.interp import eval_scalar

    t = eval_scalar(e, {})
    return ir.Const(_py(t, e.dtype), e.dtype)


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
    from hipress.compll.interp import eval_size

    try:
        return all(eval_size(a, n) == eval_size(b, n) for n in _PROBES)
    except (RuntimeError, ValueError, OverflowError):  # pragma: no cover - defensive
        return False


def same_type(a: ArrayType, b: ArrayType) -> bool:
    return a.dtype == b.dtype and a.bits == b.bits and same_length(a.length, b.length)


def fold_deep(e: ir.Expr) -> ir.Expr:
    """Fold bottom-up through a freshly built tree."""
    if isinstance(e, ir.Unary):
        return fold(ir.Unary(e.op, fold_deep(e.x), e.dtype))
    if isinstance(e, ir.Cast):
        return fold(ir.Cast(fold_deep(e.x), e.dtype))
    if isinstance(e, ir.Binary):
        return fold(ir.Binary(e.op, fold_deep(e.a), fold_deep(e.b), e.dtype))
    if isinstance(e, ir.Select):
        return fold(ir.Select(fold_deep(e.cond), fold_deep(e.a), fold_deep(e.b), e.dtype))
    return e


def _children(e: ir.Expr) -> list[ir.Expr]:
    if isinstance(e, ir.Unary | ir.Cast):
        return [e.x]
    if isinstance(e, ir.Binary):
        return [e.a, e.b]
    if isinstance(e, ir.Select):
        return [e.cond, e.a, e.b]
    return []


def _py(t: torch.Tensor, dt: DType) -> int | float | bool:
    if dt.is_bool:
        return bool(t.item())
    if dt.is_int:
        return int(t.item())
    return float(t.to(torch.float64).item())


def refs(e: ir.Expr) -> set[str]:
    """Names referenced by ``e`` (Ref names and loaded arrays)."""
    out: set[str] = set()
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, ir.Ref):
            out.add(x.name)
        elif isinstance(x, ir.Load):
            out.add(x.array)
            stack.append(x.index)
        elif isinstance(x, ir.Rand):
            out.add("<random>")
            stack.append(x.counter)
        else:
            stack.extend(_children(x))
    return out


# ---------------------------------------------------------------- conversions


def _representable(c: ir.Const, dst: DType, lit: bool) -> bool:
    src = c.dtype
    if src == dst:
        return True
    if dst.is_bool or src.is_bool or dst.storage_only:
        return False
    if src.is_int and dst.is_int:
        from hipress.compll.semantics import int_range

        lo, hi = int_range(dst)
        return lo <= int(c.value) <= hi
    if src.is_int and dst.is_float:
        return True
    if src.is_float and dst.is_float:
        return lit or dst.bits >= src.bits
    return False


def _convert(c: ir.Const, dst: DType) -> ir.Const:
    if dst.is_float:
        return ir.Const(float(c.value), dst)
    return ir.Const(int(c.value), dst)


def _retype_literal(e: ir.Expr, t: DType) -> ir.Expr | None:
    """Give an expression built only from literals (e.g. ``c ? 1 : 0``) the type ``t``."""
    if isinstance(e, ir.Const):
        return _convert(e, t) if _representable(e, t, True) else None
    if isinstance(e, ir.Select):
        a, b = _retype_literal(e.a, t), _retype_literal(e.b, t)
        if a is None or b is None:
            return None
        return ir.Select(e.cond, a, b, t)
    return None


class BodyChecker(ExprChecker, ParallelChecker, BitsChecker):
    """Statements and expressions. Expects ``err``, ``fresh``, ``_type``, ``_size``, ``top``,
    ``fns`` and ``fn_stack`` from :class:`hipress.compll.check.Elaborator`."""

    top: Scope
    fns: dict[str, ast.FnDecl]
    fn_stack: list[str]

    # provided by Elaborator
    def err(self, msg: str, span: Span | None) -> CllTypeError:  # pragma: no cover
        raise NotImplementedError

    def fresh(self, base: str) -> str:  # pragma: no cover
        raise NotImplementedError

    def _type(self, t: ast.TypeAnn, scope: Scope) -> DType | ArrayType:  # pragma: no cover
        raise NotImplementedError

    def _size(
        self, e: ast.Expr, scope: Scope, ctx: _Ctx | None = None
    ) -> ir.Expr:  # pragma: no cover
        raise NotImplementedError

    # -- coercion

    def _coerce(self, v: Scalar, t: DType, span: Span) -> Scalar:
        if v.dtype == t:
            return Scalar(v.expr)
        if isinstance(v.expr, ir.Const) and _representable(v.expr, t, v.lit):
            return Scalar(_convert(v.expr, t))
        if v.lit:
            retyped = _retype_literal(v.expr, t)
            if retyped is not None:
                return Scalar(retyped)
        if isinstance(v.expr, ir.Const) and v.dtype.is_int and t.is_int:
            from hipress.compll.semantics import int_range

            lo, hi = int_range(t)
            raise self.err(f"{v.expr.value} is out of range for {t} ({lo} to {hi})", span)
        raise self.err(f"expected {t}, got {v.dtype}; convert explicitly, e.g. {t}(...)", span)

    def _concrete(self, v: Scalar) -> Scalar:
        return Scalar(v.expr) if v.lit else v

    def _unify(self, lhs: Scalar, rhs: Scalar, span: Span, what: str) -> tuple[Scalar, Scalar]:
        if lhs.dtype == rhs.dtype:
            return lhs, rhs
        lc, rc = isinstance(lhs.expr, ir.Const), isinstance(rhs.expr, ir.Const)
        if lhs.lit and rhs.lit:  # int literal meets float literal (or a ?: of literals)
            a, b = _retype_literal(lhs.expr, F32), _retype_literal(rhs.expr, F32)
            if a is not None and b is not None:
                return Scalar(a, True), Scalar(b, True)
        if lc and (lhs.lit or not rc) and _representable(lhs.expr, rhs.dtype, lhs.lit):
            return Scalar(_convert(lhs.expr, rhs.dtype)), rhs
        if rc and _representable(rhs.expr, lhs.dtype, rhs.lit):
            return lhs, Scalar(_convert(rhs.expr, lhs.dtype))
        if lc and _representable(lhs.expr, rhs.dtype, lhs.lit):
            return Scalar(_convert(lhs.expr, rhs.dtype)), rhs
        raise self.err(
            f"mismatched types {lhs.dtype} and {rhs.dtype} in `{what}`; convert one explicitly, "
            f"e.g. {lhs.dtype}(...) or {rhs.dtype}(...)",
            span,
        )

    # -- statements

    def _bind(self, scope: Scope, name: str, v: Value, kind: str, span: Span) -> None:
        if name in scope.names:
            raise self.err(f"`{name}` is already defined in this block", span)
        if name in SCALAR_TYPES or name in BUILTINS:
            raise self.err(f"`{name}` is a builtin name and cannot be redefined", span)
        scope.names[name] = Binding(v, kind)

    def _emit_scalar(self, name: str, v: Scalar, ctx: _Ctx) -> Scalar:
        v = self._concrete(v)
        if isinstance(v.expr, ir.Const | ir.Ref):
            return v
        ssa = self.fresh(name)
        if ctx.host:
            ctx.ops.append(ir.Let(ssa, v.expr))
        else:
            ctx.ops.append((ssa, v.expr))
        return Scalar(ir.Ref(ssa, v.dtype))

    def _stmt(self, s: ast.Stmt, scope: Scope, ctx: _Ctx) -> None:
        if isinstance(s, ast.Let | ast.VarDecl):
            kind = "let" if isinstance(s, ast.Let) else "var"
            want = self._type(s.type, scope) if s.type is not None else None
            if isinstance(want, ArrayType):
                if kind == "var":
                    raise self.err("`var` holds scalars only; use `let` for arrays", s.span)
                v = self._value(s.value, scope, ctx, s.name, want)
                if not isinstance(v, Array) or not same_type(v.type, want):
                    got = v.type.describe() if isinstance(v, Array) else "a scalar"
                    raise self.err(
                        f"`{s.name}` is declared {want.describe()} but the value is {got}",
                        s.value.span,
                    )
                self._bind(scope, s.name, v, kind, s.span)
                return
            v = self._value(s.value, scope, ctx, s.name)
            if isinstance(v, Array):
                if kind == "var":
                    raise self.err("`var` holds scalars only; use `let` for arrays", s.span)
                if want is not None:
                    raise self.err(
                        f"`{s.name}` is declared {want} but the value is an array", s.value.span
                    )
                self._bind(scope, s.name, v, kind, s.span)
                return
            if isinstance(v, Tuple_):
                raise self.err(
                    "this returns several values; unpack them with `let (a, b) = ...`", s.span
                )
            if want is not None:
                v = self._coerce(v, want, s.value.span)
            self._bind(scope, s.name, self._emit_scalar(s.name, v, ctx), kind, s.span)
            return
        if isinstance(s, ast.LetTuple):
            v = self._value(s.value, scope, ctx, s.names[0], names=s.names)
            if not isinstance(v, Tuple_):
                raise self.err("only filter, topk and extract return several values", s.span)
            if len(v.items) != len(s.names):
                raise self.err(
                    f"expected {len(v.items)} names to unpack, got {len(s.names)}", s.span
                )
            for name, item in zip(s.names, v.items, strict=True):
                self._bind(scope, name, item, "let", s.span)
            return
        if isinstance(s, ast.Assign):
            self._assign(s, scope, ctx)
            return
        if isinstance(s, ast.If):
            self._if(s, scope, ctx)
            return
        if isinstance(s, ast.Return):
            raise self.err("`return` must be the last statement of its block", s.span)
        raise self.err("unsupported statement", getattr(s, "span", None))  # pragma: no cover

    def _assign(self, s: ast.Assign, scope: Scope, ctx: _Ctx) -> None:
        b = scope.lookup(s.name)
        if b is None:
            raise self.err(f"unknown name `{s.name}`{self._suggest(s.name, scope)}", s.span)
        if b.kind == "state":
            if ctx.in_branch or not ctx.host:
                raise self.err("state can only be assigned at the top level of encode", s.span)
            if s.op != "=":
                raise self.err("state arrays are assigned with `=` only", s.span)
            first = self.state_assigned.setdefault(s.name, s.span)
            if first is not s.span:
                raise self.err(
                    f"state `{s.name}` is assigned twice (first at line {first.line}); compute "
                    "its new value with `let`s and assign it once",
                    s.span,
                )
            if isinstance(b.value, Array):
                v = self._value(s.value, scope, ctx, s.name, b.value.type)
                if not isinstance(v, Array) or not same_type(v.type, b.value.type):
                    got = v.type.describe() if isinstance(v, Array) else "a scalar"
                    raise self.err(
                        f"state `{s.name}` is {b.value.type.describe()}, the value is {got}",
                        s.value.span,
                    )
                ctx.ops.append(ir.StoreState(s.name, v.name))
                self.top_state_scope(scope).names[s.name] = Binding(v, "state")
                return
            assert isinstance(b.value, Scalar)
            v2 = self._coerce(self._scalar(s.value, scope, ctx), b.value.dtype, s.value.span)
            v2 = self._emit_scalar(s.name, v2, ctx)
            ctx.ops.append(ir.StoreState(s.name, v2.expr))
            self.top_state_scope(scope).names[s.name] = Binding(v2, "state")
            return
        if b.kind not in ("var", "assigned"):
            raise self.err(
                f"cannot assign to `{s.name}` (declared as {b.kind}; use `var` for a variable)",
                s.span,
            )
        owner = scope.owner(s.name)
        if not scope.owned_inside(s.name):
            raise self.err(
                f"cannot assign to `{s.name}` here: it belongs to the enclosing code", s.span
            )
        assert isinstance(b.value, Scalar)
        rhs = self._scalar(s.value, scope, ctx)
        if s.op != "=":
            rhs = self._binary(s.op[0], b.value, rhs, s.span)
        rhs = self._coerce(rhs, b.value.dtype, s.value.span)
        new = self._emit_scalar(s.name, rhs, ctx)
        # an assignment inside an `if` branch shadows the variable there; the `if` merges it
        scope.names[s.name] = Binding(new, "var" if owner is scope else "assigned")

    def top_state_scope(self, scope: Scope) -> Scope:
        owner = scope
        while owner.parent is not None and owner.parent is not self.top:
            owner = owner.parent
        return owner

    def _if(self, s: ast.If, scope: Scope, ctx: _Ctx) -> None:
        cond = self._scalar(s.cond, scope, ctx)
        if cond.dtype != BOOL:
            raise self.err(f"`if` condition must be bool, got {cond.dtype}", s.cond.span)
        cond = self._emit_scalar("cond", cond, ctx)
        branches = []
        for body in (s.then, s.other):
            sub = Scope(scope)
            n_ops = len(ctx.ops)
            was = ctx.in_branch
            ctx.in_branch = True
            if isinstance(body, ast.Block):
                for st in body.stmts:
                    self._stmt(st, sub, ctx)
            elif isinstance(body, ast.If):
                self._if(body, sub, ctx)
            ctx.in_branch = was
            if ctx.host and any(not isinstance(o, ir.Let) for o in ctx.ops[n_ops:]):
                raise self.err(
                    "parallel operators cannot run under `if`; compute both sides and "
                    "choose with `c ? a : b`",
                    s.span,
                )
            branches.append(sub)
        then_s, else_s = branches
        changed = [
            k
            for k, b in {**then_s.names, **else_s.names}.items()
            if b.kind == "assigned" and scope.lookup(k) is not None
        ]
        for name in sorted(changed):
            outer = scope.lookup(name)
            assert outer is not None and isinstance(outer.value, Scalar)
            a = then_s.names[name].value if name in then_s.names else outer.value
            b = else_s.names[name].value if name in else_s.names else outer.value
            assert isinstance(a, Scalar) and isinstance(b, Scalar)
            merged = Scalar(fold(ir.Select(cond.expr, a.expr, b.expr, outer.value.dtype)))
            kind = "var" if name in scope.names and scope.names[name].kind == "var" else "assigned"
            scope.names[name] = Binding(self._emit_scalar(name, merged, ctx), kind)

    def _suggest(self, name: str, scope: Scope) -> str:
        pool: set[str] = set(BUILTINS) | set(SCALAR_TYPES) | set(self.fns)
        s: Scope | None = scope
        while s is not None:
            pool |= set(s.names)
            s = s.parent
        close = difflib.get_close_matches(name, sorted(pool), n=1)
        return f"; did you mean `{close[0]}`?" if close else ""
