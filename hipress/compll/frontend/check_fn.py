"""Elaboration of user functions (inlined at each call) and lambdas (the per-element code of
parallel operators)."""

from __future__ import annotations

from hipress.compll.frontend import ast
from hipress.compll.frontend.check_expr import scalar, value
from hipress.compll.frontend.check_stmt import body, host_block, not_n
from hipress.compll.frontend.check_types import same_type, type_of
from hipress.compll.frontend.coerce import coerce, concrete, emit_scalar
from hipress.compll.frontend.scope import (
    MAX_CALL_DEPTH,
    Array,
    Binding,
    Ctx,
    Elab,
    Scalar,
    Scope,
    Value,
)
from hipress.compll.ir import nodes as ir
from hipress.compll.ir.types import ArrayType, DType


def inline(cx: Elab, e: ast.Call, scope: Scope, ctx: Ctx, name_hint: str = "t") -> Value:
    """The value of a call of user function ``e.func``: its arguments bound (converted to the
    parameter types) and its body elaborated in place. A function that takes or returns an
    array runs in host code only, and may use parallel operators; any other function may not.
    ``name_hint`` names an array result."""
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
    host = _takes_arrays(cx, fn)
    if host and (not ctx.host or ctx.no_parallel):
        raise cx.err(
            f"`{fn.name}` takes or returns arrays: call it in encode or decode (or another "
            "such function), not inside a lambda or a scalar fn",
            e.span,
        )
    cx.called.add(e.func)
    fscope = Scope(cx.top, boundary=True)
    for p, a in zip(fn.params, e.args, strict=True):
        t = _param_type(cx, p)
        if isinstance(t, ArrayType):
            v = value(cx, a, scope, ctx)
            if not isinstance(v, Array) or not same_type(v.type, t):
                got = v.type.describe() if isinstance(v, Array) else "a scalar"
                raise cx.err(
                    f"argument `{p.name}` of `{fn.name}` is {t.describe()}, got {got}", a.span
                )
            fscope.names[p.name] = Binding(v, "let")
            continue
        sv = coerce(cx, scalar(cx, a, scope, ctx), t, a.span)
        fscope.names[p.name] = Binding(emit_scalar(cx, p.name, sv, ctx), "let")
    return _body(cx, fn, fscope, ctx, host, name_hint)


def check_uncalled(cx: Elab) -> None:
    """Check the functions no call reached, as if called with values of their parameter types
    (in encode, where everything a function may use is allowed): an error in a function is
    reported whether or not the program calls it."""
    for name, fn in cx.fns.items():
        if name in cx.called:
            continue
        host = _takes_arrays(cx, fn)
        fscope = Scope(cx.top, boundary=True)
        ctx = Ctx(host=host, in_encode=True, ops=[])
        for p in fn.params:
            t = _param_type(cx, p)
            v: Value = (
                Array(cx.fresh(p.name), t)
                if isinstance(t, ArrayType)
                else Scalar(ir.Ref(cx.fresh(p.name), t))
            )
            fscope.names[p.name] = Binding(v, "let")
        _body(cx, fn, fscope, ctx, host, name)


def _takes_arrays(cx: Elab, fn: ast.FnDecl) -> bool:
    """Whether ``fn`` takes or returns an array (its body then runs as host code)."""
    anns = [p.type for p in fn.params] + [fn.ret]
    return any(not isinstance(a, ast.ScalarTypeAnn) for a in anns)


def _param_type(cx: Elab, p: ast.FnParam) -> DType | ArrayType:
    not_n(cx, p.name, p.span)
    return type_of(cx, p.type, cx.top)


def _body(cx: Elab, fn: ast.FnDecl, fscope: Scope, ctx: Ctx, host: bool, name_hint: str) -> Value:
    """The value of ``fn``'s body with its parameters bound in ``fscope``, of its return type
    (``host``: it may hold parallel operators and return an array)."""
    ret_t = type_of(cx, fn.ret, cx.top)
    what = f"fn `{fn.name}`"
    cx.fn_stack.append(fn.name)
    was = ctx.no_parallel
    ctx.no_parallel = not host
    try:
        if not host:
            assert isinstance(ret_t, DType)
            return coerce(cx, body(cx, fn.body, fscope, ctx, what), ret_t, fn.body.span)
        ret = host_block(cx, fn.body, fscope, ctx, what)
        expect = ret_t if isinstance(ret_t, ArrayType) else None
        v = value(cx, ret.value, fscope, ctx, name_hint, expect)
    finally:
        cx.fn_stack.pop()
        ctx.no_parallel = was
    if isinstance(ret_t, DType):
        if not isinstance(v, Scalar):
            raise cx.err(f"{what} returns {ret_t}, not an array", ret.value.span)
        return coerce(cx, v, ret_t, ret.value.span)
    if not isinstance(v, Array) or not same_type(v.type, ret_t):
        got = v.type.describe() if isinstance(v, Array) else "a scalar"
        raise cx.err(f"{what} returns {ret_t.describe()}, got {got}", ret.value.span)
    return v


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
