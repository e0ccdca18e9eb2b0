"""Elaboration of user functions (inlined at each call) and lambdas (the per-element code of
parallel operators)."""

from __future__ import annotations

from hipress.compll.frontend import ast
from hipress.compll.frontend.check_expr import scalar
from hipress.compll.frontend.check_stmt import body, not_n
from hipress.compll.frontend.check_types import type_of
from hipress.compll.frontend.coerce import coerce, concrete, emit_scalar
from hipress.compll.frontend.scope import MAX_CALL_DEPTH, Binding, Ctx, Elab, Scalar, Scope
from hipress.compll.ir import nodes as ir
from hipress.compll.ir.types import DType


def inline(cx: Elab, e: ast.Call, scope: Scope, ctx: Ctx) -> Scalar:
    """The value of a call of user function ``e.func``: its arguments bound (converted to the
    parameter types) and its body elaborated in place, no parallel operators allowed."""
    fn = cx.fns[e.func]
    if e.func in cx.fn_stack:
        raise cx.err(f"function `{e.func}` calls itself; recursion is not supported", e.span)
    if len(cx.fn_stack) >= MAX_CALL_DEPTH:
        chain = " -> ".join(f"`{f}`" for f in [*cx.fn_stack[:3], "...", e.func])
        raise cx.err(
            f"functions call each other more than {MAX_CALL_DEPTH} deep ({chain}); "
            "flatten the chain",
            e.span,
        )
    if len(e.args) != len(fn.params):
        raise cx.err(f"`{fn.name}` takes {len(fn.params)} argument(s), got {len(e.args)}", e.span)
    cx.called.add(e.func)
    fscope = Scope(cx.top, boundary=True)
    for p, a in zip(fn.params, e.args, strict=True):
        v = coerce(cx, scalar(cx, a, scope, ctx), _param_type(cx, p), a.span)
        fscope.names[p.name] = Binding(emit_scalar(cx, p.name, v, ctx), "let")
    return _body(cx, fn, fscope, ctx)


def check_uncalled(cx: Elab) -> None:
    """Check the functions no call reached, as if called with values of their parameter types
    (in encode, where everything a function may use is allowed): an error in a function is
    reported whether or not the program calls it."""
    for name, fn in cx.fns.items():
        if name in cx.called:
            continue
        fscope = Scope(cx.top, boundary=True)
        ctx = Ctx(host=False, in_encode=True, ops=[])
        for p in fn.params:
            fscope.names[p.name] = Binding(
                Scalar(ir.Ref(cx.fresh(p.name), _param_type(cx, p))), "let"
            )
        _body(cx, fn, fscope, ctx)


def _param_type(cx: Elab, p: ast.FnParam) -> DType:
    not_n(cx, p.name, p.span)
    t = type_of(cx, p.type, cx.top)
    if not isinstance(t, DType):
        raise cx.err("fn parameters must be scalars", p.span)
    return t


def _body(cx: Elab, fn: ast.FnDecl, fscope: Scope, ctx: Ctx) -> Scalar:
    """The value of ``fn``'s body with its parameters bound in ``fscope``, converted to its
    return type."""
    ret_t = type_of(cx, fn.ret, cx.top)
    if not isinstance(ret_t, DType):
        raise cx.err("fn must return a scalar", fn.ret.span)
    cx.fn_stack.append(fn.name)
    was = ctx.no_parallel
    ctx.no_parallel = True
    try:
        result = body(cx, fn.body, fscope, ctx, f"fn `{fn.name}`")
    finally:
        cx.fn_stack.pop()
        ctx.no_parallel = was
    return coerce(cx, result, ret_t, fn.body.span)


def lambda_(
    cx: Elab, e: ast.Expr, ptypes: tuple[DType, ...], scope: Scope, ctx: Ctx, what: str
) -> ir.Lambda:
    """Lambda ``e`` with parameters of types ``ptypes``, as an :class:`ir.Lambda` (its lets
    emitted into a fresh lambda context; ``what`` names the operator in errors)."""
    shape = "i => ..." if len(ptypes) == 1 else "(a, b) => ..."
    if not isinstance(e, ast.Lambda):
        raise cx.err(f"{what} expects a lambda `{shape}` here", e.span)
    if len(e.params) != len(ptypes):
        raise cx.err(f"{what} expects a lambda of {len(ptypes)} parameter(s) `{shape}`", e.span)
    lscope = Scope(scope, boundary=True)
    lets: list[tuple[str, ir.Expr]] = []
    lctx = Ctx(host=False, in_encode=ctx.in_encode, ops=lets)
    params = []
    for name, t in zip(e.params, ptypes, strict=True):
        not_n(cx, name, e.span)
        r = ir.Ref(cx.fresh(name), t)
        lscope.names[name] = Binding(Scalar(r), "let")
        params.append(r)
    result = concrete(body(cx, e.body, lscope, lctx, "a lambda"))
    return ir.Lambda(tuple(params), tuple(lets), result.expr)


def with_result(lam: ir.Lambda, result: ir.Expr) -> ir.Lambda:
    """``lam`` with ``result`` as its result."""
    return ir.Lambda(lam.params, lam.lets, result)
