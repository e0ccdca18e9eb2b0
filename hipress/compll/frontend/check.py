"""Stage 2: checked elaboration of an AST into the IR, for concrete hyper-parameter values.

One walk checks names, types, parameter values and array lengths, and emits IR as it goes: the
IR *is* the checked program. Parameters and ``const`` declarations are folded to constants (the
program is specialised), array lengths stay expressions of ``n``. Every problem is a
:class:`CllTypeError` or :class:`CllParamError` pointing at the offending span.

This module checks the program's declarations, ``encode`` and ``decode``. The rest of the
checker is plain functions over one :class:`~hipress.compll.frontend.scope.Elab`, one module a
concern, each importing only the ones listed before it:

- ``scope``: values, scopes, the emission context, the checker's state, builtin names;
- ``coerce``: implicit conversions, literals adapting to the other operand;
- ``check_bits``, ``check_call``: builtin calls (bit casts, math, min/max, clamp, random);
- ``check_expr``: expressions and operators (typed by :mod:`hipress.compll.ir.ops`);
- ``check_types``: type annotations and array lengths;
- ``check_stmt``: statements and blocks; ``check_fn``: inlined functions and lambdas;
- ``check_par``: the parallel operators; ``check_params``: parameters and constants.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from itertools import product
from typing import Any

from hipress.compll.frontend import ast
from hipress.compll.frontend.check_expr import scalar, value
from hipress.compll.frontend.check_fn import check_uncalled, inline
from hipress.compll.frontend.check_par import parallel
from hipress.compll.frontend.check_params import const, declare
from hipress.compll.frontend.check_params import params as check_params
from hipress.compll.frontend.check_stmt import host_block
from hipress.compll.frontend.check_types import same_type, type_of
from hipress.compll.frontend.coerce import coerce
from hipress.compll.frontend.parse import parse
from hipress.compll.frontend.rounds import is_rounds, split
from hipress.compll.frontend.scope import (
    BUILTINS,
    N_REF,
    Array,
    Binding,
    Ctx,
    Elab,
    Scalar,
    Scope,
    Tuple_,
    Value,
    constant_scope,
)
from hipress.compll.ir import nodes as ir
from hipress.compll.ir.prune import prune
from hipress.compll.ir.source import CllTypeError, SourceFile, Span
from hipress.compll.ir.types import F32, SCALAR_TYPES, ArrayType, DType

MAX_NAME = 64  # characters of an algorithm's name (it names files and kernels)


def _layout(cx: Elab, decls: tuple[ast.Decl, ...]) -> tuple[ast.AlgorithmDecl, ast.PayloadDecl]:
    """The program's one ``algorithm`` and one ``payload`` declaration; raises unless it also
    has one ``encode`` and one ``decode``."""
    algo = [d for d in decls if isinstance(d, ast.AlgorithmDecl)]
    if not algo:
        raise CllTypeError("missing `algorithm NAME;` declaration", cx.src, Span(1, 1, 1, 2))
    if len(algo) > 1:
        raise cx.err("more than one `algorithm` declaration", algo[1].span)
    if len(algo[0].name) > MAX_NAME:
        raise cx.err(
            f"the algorithm's name has {len(algo[0].name)} characters; at most {MAX_NAME}",
            algo[0].span,
        )
    for kind, cls in (("encode", ast.EncodeDecl), ("decode", ast.DecodeDecl)):
        found = [d for d in decls if isinstance(d, cls)]
        if not found:
            raise cx.err(f"algorithm has no `{kind}` function", algo[0].span)
        if len(found) > 1:
            raise cx.err(f"more than one `{kind}` function", found[1].span)
    payloads = [d for d in decls if isinstance(d, ast.PayloadDecl)]
    if not payloads:
        raise cx.err("algorithm has no `payload { ... }` declaration", algo[0].span)
    if len(payloads) > 1:
        raise cx.err("more than one `payload` declaration", payloads[1].span)
    return algo[0], payloads[0]


def _declarations(cx: Elab, decls: tuple[ast.Decl, ...], top: Scope) -> list[ir.Slot]:
    """Bind the ``const``s in ``top``, collect the user functions into ``cx.fns`` and return the
    declared state."""
    state: list[ir.Slot] = []
    state_spans: dict[str, Span] = {}
    for d in decls:
        if isinstance(d, ast.ConstDecl):
            declare(cx, top, d.name, d.span)
            v = const(cx, d, top)
            top.names[d.name] = Binding(v, "const")
        elif isinstance(d, ast.StateDecl):
            declare(cx, top, d.name, d.span)
            if d.name in state_spans:
                raise cx.err(
                    f"state `{d.name}` is declared twice (first at line "
                    f"{state_spans[d.name].line})",
                    d.span,
                )
            state_spans[d.name] = d.span
            t = type_of(cx, d.type, top)
            state.append(ir.Slot(d.name, t))
            cx.used[d.name] = 1
        elif isinstance(d, ast.FnDecl):
            if d.name in BUILTINS or d.name in SCALAR_TYPES:
                raise cx.err(f"function `{d.name}` would shadow a builtin", d.span)
            if d.name in cx.fns:
                raise cx.err(f"function `{d.name}` is defined twice", d.span)
            cx.fns[d.name] = d
    return state


def _payload(cx: Elab, payload: ast.PayloadDecl, top: Scope) -> list[ir.Slot]:
    """The payload's fields, in order (at least one, names distinct)."""
    fields: list[ir.Slot] = []
    seen: set[str] = set()
    for f in payload.fields:
        if f.name in seen:
            raise cx.err(f"payload field `{f.name}` is declared twice", f.span)
        seen.add(f.name)
        fields.append(ir.Slot(f.name, type_of(cx, f.type, top)))
    if not fields:
        raise cx.err("payload has no fields", payload.span)
    return fields


def _recursion_check(cx: Elab) -> None:
    """Every function, called or not: none may call itself, directly or through others."""
    calls = {name: _called(fn.body, cx.fns) for name, fn in cx.fns.items()}
    for start in cx.fns:
        path, stack = [start], [iter(sorted(calls[start]))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                stack.pop()
                path.pop()
                continue
            if nxt == start:
                how = (
                    ""
                    if len(path) == 1
                    else " through " + " -> ".join(f"`{f}`" for f in [*path, start])
                )
                raise cx.err(
                    f"function `{start}` calls itself{how}; recursion is not supported",
                    calls[path[-1]][start].span,
                )
            if nxt not in path and len(path) <= len(cx.fns):
                path.append(nxt)
                stack.append(iter(sorted(calls[nxt])))


def _encode(
    cx: Elab, d: ast.EncodeDecl, top: Scope, state: list[ir.Slot], fields: list[ir.Slot]
) -> ir.Encode:
    """``encode(grad)``: its ops and the payload fields its ``return concat(...)`` gives."""
    scope = Scope(top)
    cx.used[d.arg] = 1
    scope.names[d.arg] = Binding(Array(d.arg, ArrayType(F32, N_REF)), "let")
    for s in state:
        v: Value = (
            Array(s.name, s.type)
            if isinstance(s.type, ArrayType)
            else Scalar(ir.Ref(s.name, s.type))
        )
        scope.names[s.name] = Binding(v, "state")
    ctx = Ctx(host=True, in_encode=True, ops=[])
    ret = host_block(cx, d.body, scope, ctx, "encode")
    if not (isinstance(ret.value, ast.Call) and ret.value.func == "concat"):
        raise cx.err("encode must end with `return concat(...)`", ret.value.span)
    outs = _concat(cx, ret.value, scope, ctx, fields)
    return ir.Encode(d.arg, tuple(ctx.ops), tuple(outs))


def _decode(cx: Elab, d: ast.DecodeDecl, top: Scope, fields: list[ir.Slot]) -> ir.Decode:
    """``decode(payload)``: its ops and the f32[n] array it returns (state is hidden)."""
    scope = Scope(top)
    cx.used[d.arg] = 1
    items: list[Scalar | Array] = []
    for f in fields:
        name = f"{d.arg}.{f.name}"
        items.append(
            Array(name, f.type) if isinstance(f.type, ArrayType) else Scalar(ir.Ref(name, f.type))
        )
    scope.names[d.arg] = Binding(Tuple_(tuple(items)), "payload")
    cx.payload_fields = {f.name: it for f, it in zip(fields, items, strict=True)}
    ctx = Ctx(host=True, in_encode=False, ops=[])
    ret = host_block(cx, d.body, scope, ctx, "decode")
    v = value(cx, ret.value, scope, ctx, name_hint="out")
    want = ArrayType(F32, N_REF)
    if not isinstance(v, Array) or not same_type(v.type, want):
        got = v.type.describe() if isinstance(v, Array) else "a scalar"
        raise cx.err(f"decode must return f32[n], got {got}", ret.value.span)
    return ir.Decode(d.arg, tuple(ctx.ops), v.name)


def _concat(
    cx: Elab, call: ast.Call, scope: Scope, ctx: Ctx, fields: list[ir.Slot]
) -> list[str | ir.Expr]:
    """The payload fields of ``return concat(...)``: an array name or a scalar expression each,
    checked against the declared field types."""
    if len(call.args) != len(fields):
        names = ", ".join(f.name for f in fields)
        raise cx.err(
            f"concat takes one argument per payload field ({names}): "
            f"expected {len(fields)}, got {len(call.args)}",
            call.span,
        )
    outs: list[str | ir.Expr] = []
    for a, f in zip(call.args, fields, strict=True):
        if isinstance(f.type, DType):
            v = scalar(cx, a, scope, ctx)
            outs.append(coerce(cx, v, f.type, a.span).expr)
            continue
        hint_t = f.type
        v2 = value(cx, a, scope, ctx, name_hint=f.name, expect=hint_t)
        if not isinstance(v2, Array) or not same_type(v2.type, f.type):
            got = v2.type.describe() if isinstance(v2, Array) else "a scalar"
            hint = ""
            if f.type.bits is not None:
                hint = f"; declare it with `let {f.name}: {f.type.describe()} = map(...)`"
            raise cx.err(
                f"payload field `{f.name}` has type {f.type.describe()} but the argument "
                f"has type {got}{hint}",
                a.span,
            )
        outs.append(v2.name)
    return outs


def _called(node: object, fns: Mapping[str, ast.FnDecl]) -> dict[str, ast.Call]:
    """The functions in ``fns`` that ``node`` (an AST subtree) calls, each with a call."""
    out: dict[str, ast.Call] = {}
    stack = [node]
    while stack:
        x = stack.pop()
        if isinstance(x, ast.Call) and x.func in fns:
            out.setdefault(x.func, x)
        if isinstance(x, tuple | list):
            stack.extend(x)
        elif hasattr(x, "__dataclass_fields__"):
            stack.extend(getattr(x, f) for f in x.__dataclass_fields__ if f != "span")
    return out


def elaborate(source: SourceFile, module: ast.Module, params: Mapping[str, Any]) -> ir.Program:
    """Check ``module`` and return its IR specialised to ``params`` (defaults for the rest).

    Raises :class:`CllTypeError` / :class:`CllParamError` with a span on any problem.
    """
    cx = Elab(source, dict(params), parallel=parallel, inline=inline)
    if is_rounds(module):
        raise cx.err(
            "a multi-round algorithm: load it with hipress.compll.rounds.load_rounds",
            module.decls[0].span if module.decls else Span(1, 1, 1, 2),
        )
    algo, payload = _layout(cx, module.decls)
    top = Scope(constant_scope())
    cx.top = top
    cx.used[ir.N] = 1
    top.names[ir.N] = Binding(Scalar(N_REF), "builtin")
    cx.declared = {
        d.name: d.span
        for d in module.decls
        if isinstance(d, ast.ConstDecl | ast.ParamDecl | ast.StateDecl)
    }
    param_values = check_params(cx, module.decls, top)
    state = _declarations(cx, module.decls, top)
    _recursion_check(cx)
    fields = _payload(cx, payload, top)
    enc = next(d for d in module.decls if isinstance(d, ast.EncodeDecl))
    dec = next(d for d in module.decls if isinstance(d, ast.DecodeDecl))
    enc_ir = _encode(cx, enc, top, state, fields)
    cx.hidden_state = {s.name for s in state}
    dec_ir = _decode(cx, dec, top, fields)
    check_uncalled(cx)
    return prune(
        ir.Program(
            name=algo.name,
            doc=algo.doc,
            params=tuple(param_values),
            state=tuple(state),
            payload=tuple(fields),
            encode=enc_ir,
            decode=dec_ir,
        )
    )


def check_source(source: SourceFile, params: Mapping[str, Any] | None = None) -> ir.Program:
    """Parse and elaborate ``source``; see :func:`elaborate`. A multi-round algorithm has each
    of its stages checked; its first round's program is returned."""
    module = parse(source)
    if is_rounds(module):
        stages = [elaborate(source, m, params or {}) for m in split(source, module).modules]
        return stages[0]
    return elaborate(source, module, params or {})


def param_variants(module: ast.Module) -> list[dict[str, Any]]:
    """Parameter settings worth checking beyond the defaults: each value of every
    set-constrained parameter and both ends of every range (one parameter varied at a time)."""
    out: list[dict[str, Any]] = []
    for d in module.decls:
        if not isinstance(d, ast.ParamDecl) or d.constraint is None:
            continue
        vals = (
            d.constraint.values
            if isinstance(d.constraint, ast.SetConstraint)
            else (d.constraint.lo, d.constraint.hi)
        )
        for v in vals:
            if isinstance(v, ast.Number | ast.Bool):
                out.append({d.name: v.value})
    return out


MAX_COMBINATIONS = 512  # parameter settings `hipress check` tries at most


def param_combinations(module: ast.Module) -> list[dict[str, Any]]:
    """Every combination of the parameter values worth checking: each value of every
    set-constrained parameter, both ends of every range and both values of every ``bool``
    (the defaults of the others included), at most :data:`MAX_COMBINATIONS`; beyond that,
    :func:`param_variants` (one parameter varied at a time)."""
    axes: list[tuple[str, list[Any]]] = []
    for d in module.decls:
        if not isinstance(d, ast.ParamDecl):
            continue
        vals: list[Any] = [d.default.value] if isinstance(d.default, ast.Number | ast.Bool) else []
        if isinstance(d.type, ast.ScalarTypeAnn) and d.type.name == "bool":
            vals += [False, True]
        elif d.constraint is not None:
            ends = (
                d.constraint.values
                if isinstance(d.constraint, ast.SetConstraint)
                else (d.constraint.lo, d.constraint.hi)
            )
            vals += [v.value for v in ends if isinstance(v, ast.Number | ast.Bool)]
        distinct = list(dict.fromkeys(vals))
        if len(distinct) > 1:
            axes.append((d.name, distinct))
    if not axes:
        return []
    if math.prod(len(vs) for _, vs in axes) > MAX_COMBINATIONS:
        return param_variants(module)
    names = [name for name, _ in axes]
    return [dict(zip(names, combo, strict=True)) for combo in product(*(vs for _, vs in axes))]
