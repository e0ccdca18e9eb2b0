"""Elaboration of statements: ``let``, ``var``, tuple unpacking, assignment (to variables and
to state), ``if``/``else`` (branches merge assigned variables with selects), ``for`` (unrolled:
its bounds are constants of the specialised program) and blocks."""

from __future__ import annotations

from hipress.compll.frontend import ast
from hipress.compll.frontend.check_block import section
from hipress.compll.frontend.check_expr import binary, scalar, value
from hipress.compll.frontend.check_types import same_type, type_of
from hipress.compll.frontend.coerce import coerce, emit_scalar
from hipress.compll.frontend.scope import (
    BUILTINS,
    Array,
    Binding,
    Ctx,
    Elab,
    Scalar,
    Scope,
    Tuple_,
    Value,
    suggest,
)
from hipress.compll.ir import nodes as ir
from hipress.compll.ir.fold import fold
from hipress.compll.ir.source import Span
from hipress.compll.ir.types import BOOL, I64, SCALAR_TYPES, ArrayType


def bind(cx: Elab, scope: Scope, name: str, v: Value, kind: str, span: Span) -> None:
    """Bind ``name`` to ``v`` in ``scope``; raises if the block has it already or it is a
    builtin's name."""
    if name in scope.names:
        raise cx.err(f"`{name}` is already defined in this block", span)
    if name in SCALAR_TYPES or name in BUILTINS:
        raise cx.err(f"`{name}` is a builtin name and cannot be redefined", span)
    not_n(cx, name, span)
    scope.names[name] = Binding(v, kind)


def not_n(cx: Elab, name: str, span: Span) -> None:
    """Raise if a local (a let, var, lambda or fn parameter) is named ``n``, which would hide
    the element count."""
    if name == ir.N:
        raise cx.err(
            "`n` is the tensor's element count; a local of that name would hide it: "
            "choose another name",
            span,
        )


def stmt(cx: Elab, s: ast.Stmt, scope: Scope, ctx: Ctx) -> None:
    """Elaborate statement ``s`` (not a ``return``) in ``scope``, emitting into ``ctx``."""
    if isinstance(s, ast.Let | ast.VarDecl):
        _let(cx, s, scope, ctx)
        return
    if isinstance(s, ast.LetTuple):
        _let_tuple(cx, s, scope, ctx)
        return
    if isinstance(s, ast.Assign):
        if (b := scope.lookup(s.name)) is not None and b.kind == "state":
            _assign_state(cx, s, b, scope, ctx)
        else:
            assign(cx, s, scope, ctx)
        return
    if isinstance(s, ast.If):
        if_(cx, s, scope, ctx)
        return
    if isinstance(s, ast.For):
        for_(cx, s, scope, ctx)
        return
    if isinstance(s, ast.BlockSection):
        section(cx, s, scope, ctx, stmt)
        return
    if isinstance(s, ast.Return):
        raise cx.err("`return` must be the last statement of its block", s.span)
    raise cx.err("unsupported statement", getattr(s, "span", None))  # pragma: no cover


def _let(cx: Elab, s: ast.Let | ast.VarDecl, scope: Scope, ctx: Ctx) -> None:
    kind = "let" if isinstance(s, ast.Let) else "var"
    want = type_of(cx, s.type, scope) if s.type is not None else None
    if isinstance(want, ArrayType):
        v = value(cx, s.value, scope, ctx, s.name, want)
        if not isinstance(v, Array) or not same_type(v.type, want):
            got = v.type.describe() if isinstance(v, Array) else "a scalar"
            raise cx.err(
                f"`{s.name}` is declared {want.describe()} but the value is {got}",
                s.value.span,
            )
        bind(cx, scope, s.name, v, kind, s.span)
        return
    v = value(cx, s.value, scope, ctx, s.name)
    if isinstance(v, Array):
        if want is not None:
            raise cx.err(f"`{s.name}` is declared {want} but the value is an array", s.value.span)
        bind(cx, scope, s.name, v, kind, s.span)
        return
    if isinstance(v, Tuple_):
        raise cx.err("this returns several values; unpack them with `let (a, b) = ...`", s.span)
    if want is not None:
        v = coerce(cx, v, want, s.value.span)
    bind(cx, scope, s.name, emit_scalar(cx, s.name, v, ctx), kind, s.span)


def _let_tuple(cx: Elab, s: ast.LetTuple, scope: Scope, ctx: Ctx) -> None:
    v = value(cx, s.value, scope, ctx, s.names[0], names=s.names)
    if not isinstance(v, Tuple_):
        raise cx.err("only filter, topk and extract return several values", s.span)
    if len(v.items) != len(s.names):
        raise cx.err(f"expected {len(v.items)} names to unpack, got {len(s.names)}", s.span)
    for name, item in zip(s.names, v.items, strict=True):
        bind(cx, scope, name, item, "let", s.span)


def _assign_state(cx: Elab, s: ast.Assign, b: Binding, scope: Scope, ctx: Ctx) -> None:
    """``state = value`` at the top level of encode, once per state entry."""
    if ctx.in_branch or ctx.in_loop or not ctx.host or ctx.block is not None:
        raise cx.err("state can only be assigned at the top level of encode", s.span)
    if s.op != "=":
        raise cx.err("state arrays are assigned with `=` only", s.span)
    first = cx.state_assigned.setdefault(s.name, s.span)
    if first is not s.span:
        raise cx.err(
            f"state `{s.name}` is assigned twice (first at line {first.line}); compute "
            "its new value with `let`s and assign it once",
            s.span,
        )
    if isinstance(b.value, Array):
        v = value(cx, s.value, scope, ctx, s.name, b.value.type)
        if not isinstance(v, Array) or not same_type(v.type, b.value.type):
            got = v.type.describe() if isinstance(v, Array) else "a scalar"
            raise cx.err(
                f"state `{s.name}` is {b.value.type.describe()}, the value is {got}",
                s.value.span,
            )
        ctx.ops.append(ir.StoreState(s.name, v.name))
        top_state_scope(cx, scope).names[s.name] = Binding(v, "state")
        return
    assert isinstance(b.value, Scalar)
    v2 = coerce(cx, scalar(cx, s.value, scope, ctx), b.value.dtype, s.value.span)
    v2 = emit_scalar(cx, s.name, v2, ctx)
    ctx.ops.append(ir.StoreState(s.name, v2.expr))
    top_state_scope(cx, scope).names[s.name] = Binding(v2, "state")


def assign(cx: Elab, s: ast.Assign, scope: Scope, ctx: Ctx) -> None:
    """``x = e`` or ``x op= e`` to a ``var`` of this function or lambda (in a branch, the new
    value shadows it there; :func:`if_` merges it)."""
    b = scope.lookup(s.name)
    if b is None:
        raise cx.err(f"unknown name `{s.name}`{suggest(cx, s.name, scope)}", s.span)
    if b.kind not in ("var", "assigned"):
        raise cx.err(
            f"cannot assign to `{s.name}` (declared as {b.kind}; use `var` for a variable)",
            s.span,
        )
    owner = scope.owner(s.name)
    if not scope.owned_inside(s.name):
        raise cx.err(f"cannot assign to `{s.name}` here: it belongs to the enclosing code", s.span)
    if isinstance(b.value, Array):
        _assign_array(cx, s, b.value, scope, ctx)
        return
    assert isinstance(b.value, Scalar)
    rhs = scalar(cx, s.value, scope, ctx)
    if s.op != "=":
        rhs = binary(cx, s.op[0], b.value, rhs, s.span)
    rhs = coerce(cx, rhs, b.value.dtype, s.value.span)
    new = emit_scalar(cx, s.name, rhs, ctx)
    # an assignment inside an `if` branch shadows the variable there; the `if` merges it
    scope.names[s.name] = Binding(new, "var" if owner is scope else "assigned")


def _assign_array(cx: Elab, s: ast.Assign, old: Array, scope: Scope, ctx: Ctx) -> None:
    """``x = e`` to an array ``var``: ``e`` must have ``x``'s type; not under ``if``."""
    if s.op != "=":
        raise cx.err("an array `var` is assigned with `=` only", s.span)
    if ctx.in_branch:
        raise cx.err(
            "an array `var` cannot be assigned under `if`; choose per element with "
            "`map(len, i => c ? a[i] : b[i])`",
            s.span,
        )
    v = value(cx, s.value, scope, ctx, s.name, old.type)
    if not isinstance(v, Array) or not same_type(v.type, old.type):
        got = v.type.describe() if isinstance(v, Array) else "a scalar"
        raise cx.err(f"`{s.name}` is {old.type.describe()}, the value is {got}", s.value.span)
    owner = scope.owner(s.name)
    scope.names[s.name] = Binding(v, "var" if owner is scope else "assigned")


def top_state_scope(cx: Elab, scope: Scope) -> Scope:
    """The outermost scope of the function body holding ``scope`` (where state is rebound)."""
    owner = scope
    while owner.parent is not None and owner.parent is not cx.top:
        owner = owner.parent
    return owner


def if_(cx: Elab, s: ast.If, scope: Scope, ctx: Ctx) -> None:
    """``if``/``else``: both branches elaborated (scalar code only), then every variable either
    assigned merged with a select on the condition."""
    cond = scalar(cx, s.cond, scope, ctx)
    if cond.dtype != BOOL:
        raise cx.err(f"`if` condition must be bool, got {cond.dtype}", s.cond.span)
    cond = emit_scalar(cx, "cond", cond, ctx)
    branches = []
    for body in (s.then, s.other):
        sub = Scope(scope)
        n_ops = len(ctx.ops)
        was = ctx.in_branch
        ctx.in_branch = True
        if isinstance(body, ast.Block):
            for st in body.stmts:
                stmt(cx, st, sub, ctx)
        elif isinstance(body, ast.If):
            if_(cx, body, sub, ctx)
        ctx.in_branch = was
        if ctx.host and any(not isinstance(o, ir.Let) for o in ctx.ops[n_ops:]):
            raise cx.err(
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
        scope.names[name] = Binding(emit_scalar(cx, name, merged, ctx), kind)


def host_block(cx: Elab, body: ast.Block, scope: Scope, ctx: Ctx, what: str) -> ast.Return:
    """Elaborate the statements of ``body`` and return its final ``return`` (not elaborated);
    raises unless the block ends with exactly one ``return``."""
    stmts = body.stmts
    for s in stmts[:-1]:
        if isinstance(s, ast.Return):
            raise cx.err("`return` must be the last statement of its block", s.span)
    if not stmts or not isinstance(stmts[-1], ast.Return):
        raise cx.err(f"{what} must end with a return statement", body.span)
    for s in stmts[:-1]:
        stmt(cx, s, scope, ctx)
    return stmts[-1]


def body(cx: Elab, body: ast.Block | ast.Expr, scope: Scope, ctx: Ctx, what: str) -> Scalar:
    """The value of a function or lambda body: an expression, or a block ending in ``return``
    (``what`` names the body in errors)."""
    if not isinstance(body, ast.Block):
        return scalar(cx, body, scope, ctx)
    return scalar(cx, host_block(cx, body, scope, ctx, what).value, scope, ctx)


MAX_UNROLLED = 4096  # loop iterations one program may unroll to, all its loops together


def for_(cx: Elab, s: ast.For, scope: Scope, ctx: Ctx) -> None:
    """``for k in range(a, b) { ... }``: the body elaborated once per ``k`` in [a, b) (the
    bounds are constants of the specialised program), in order, with ``k`` an integer
    constant; a ``var`` the body assigns carries its value into the next iteration and out."""
    start = _loop_bound(cx, s.start, scope, ctx) if s.start is not None else 0
    stop = _loop_bound(cx, s.stop, scope, ctx)
    if s.var in SCALAR_TYPES or s.var in BUILTINS:
        raise cx.err(f"`{s.var}` is a builtin name and cannot be redefined", s.span)
    not_n(cx, s.var, s.span)
    cx.unrolled += max(0, stop - start)
    if cx.unrolled > MAX_UNROLLED:
        raise cx.err(
            f"loops run more than {MAX_UNROLLED} iterations in all (each is compiled as its "
            "own code); use a parallel operator over the iterations instead",
            s.span,
        )
    was = ctx.in_loop
    ctx.in_loop = True
    try:
        for k in range(start, stop):
            sub = Scope(scope)
            sub.names[s.var] = Binding(Scalar(ir.Const(k, I64), lit=True), "loop")
            for st in s.body.stmts:
                stmt(cx, st, sub, ctx)
            for name, b in sub.names.items():
                if b.kind == "assigned" and scope.lookup(name) is not None:
                    here = name in scope.names and scope.names[name].kind == "var"
                    scope.names[name] = Binding(b.value, "var" if here else "assigned")
    finally:
        ctx.in_loop = was


def _loop_bound(cx: Elab, e: ast.Expr, scope: Scope, ctx: Ctx) -> int:
    """A loop bound: an integer constant of the specialised program."""
    v = scalar(cx, e, scope, ctx)
    if not v.dtype.is_int or not isinstance(v.expr, ir.Const):
        what = f"an integer, got {v.dtype}" if not v.dtype.is_int else "not a constant"
        raise cx.err(
            f"a loop bound must be an integer constant (literals, parameters and consts "
            f"computed from them; not n): this one is {what}",
            e.span,
        )
    return int(v.expr.value)
