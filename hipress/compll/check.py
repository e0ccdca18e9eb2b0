"""Stage 2: checked elaboration of an AST into the IR, for concrete hyper-parameter values.

One walk checks names, types, parameter values and array lengths, and emits IR as it goes: the
IR *is* the checked program. Parameters and ``const`` declarations are folded to constants (the
program is specialised), array lengths stay expressions of ``n``. Every problem is a
:class:`CllTypeError` or :class:`CllParamError` pointing at the offending span.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from hipress.compll import ast, ir, semantics
from hipress.compll.check_body import (
    BUILTINS,
    N_REF,
    Array,
    Binding,
    BodyChecker,
    Scalar,
    Scope,
    Tuple_,
    Value,
    _Ctx,
    constant_scope,
    fold,
    refs,
    same_type,
)
from hipress.compll.parse import parse
from hipress.compll.source import CllParamError, CllTypeError, SourceFile, Span
from hipress.compll.types import (
    F32,
    I64,
    PACKED_BITS,
    PARAM_TYPES,
    SCALAR_TYPES,
    U8,
    ArrayType,
    DType,
)

MAX_NAME = 64  # characters of an algorithm's name (it names files and kernels)

# ---------------------------------------------------------------- the elaborator


class Elaborator(BodyChecker):
    def __init__(self, source: SourceFile, module: ast.Module, values: Mapping[str, Any]):
        self.src = source
        self.mod = module
        self.values = dict(values)
        self.used: dict[str, int] = {}
        self.fns: dict[str, ast.FnDecl] = {}
        self.fn_stack: list[str] = []

    # -- errors and names

    def err(self, msg: str, span: Span | None) -> CllTypeError:
        return CllTypeError(msg, self.src, span)

    def fresh(self, base: str) -> str:
        k = self.used.get(base, 0)
        self.used[base] = k + 1
        return base if k == 0 else f"{base}.{k}"

    # -- top level

    def run(self) -> ir.Program:
        decls = self.mod.decls
        algo = [d for d in decls if isinstance(d, ast.AlgorithmDecl)]
        if not algo:
            raise CllTypeError("missing `algorithm NAME;` declaration", self.src, Span(1, 1, 1, 2))
        if len(algo) > 1:
            raise self.err("more than one `algorithm` declaration", algo[1].span)
        if len(algo[0].name) > MAX_NAME:
            raise self.err(
                f"the algorithm's name has {len(algo[0].name)} characters; at most {MAX_NAME}",
                algo[0].span,
            )
        for kind, cls in (("encode", ast.EncodeDecl), ("decode", ast.DecodeDecl)):
            found = [d for d in decls if isinstance(d, cls)]
            if not found:
                raise self.err(f"algorithm has no `{kind}` function", algo[0].span)
            if len(found) > 1:
                raise self.err(f"more than one `{kind}` function", found[1].span)
        payloads = [d for d in decls if isinstance(d, ast.PayloadDecl)]
        if not payloads:
            raise self.err("algorithm has no `payload { ... }` declaration", algo[0].span)
        if len(payloads) > 1:
            raise self.err("more than one `payload` declaration", payloads[1].span)

        top = Scope(constant_scope())
        self.top = top
        self.used[ir.N] = 1
        top.names[ir.N] = Binding(Scalar(N_REF), "builtin")
        params = self._params(decls, top)
        state: list[ir.Slot] = []
        state_spans: dict[str, Span] = {}
        self.state_assigned: dict[str, Span] = {}
        for d in decls:
            if isinstance(d, ast.ConstDecl):
                self._declare(top, d.name, d.span)
                v = self._const(d, top)
                top.names[d.name] = Binding(v, "const")
            elif isinstance(d, ast.StateDecl):
                self._declare(top, d.name, d.span)
                if d.name in state_spans:
                    raise self.err(
                        f"state `{d.name}` is declared twice (first at line "
                        f"{state_spans[d.name].line})",
                        d.span,
                    )
                state_spans[d.name] = d.span
                t = self._type(d.type, top)
                state.append(ir.Slot(d.name, t))
                self.used[d.name] = 1
            elif isinstance(d, ast.FnDecl):
                if d.name in BUILTINS or d.name in SCALAR_TYPES:
                    raise self.err(f"function `{d.name}` would shadow a builtin", d.span)
                if d.name in self.fns:
                    raise self.err(f"function `{d.name}` is defined twice", d.span)
                self.fns[d.name] = d
        self._recursion_check()
        fields: list[ir.Slot] = []
        seen: set[str] = set()
        for f in payloads[0].fields:
            if f.name in seen:
                raise self.err(f"payload field `{f.name}` is declared twice", f.span)
            seen.add(f.name)
            fields.append(ir.Slot(f.name, self._type(f.type, top)))
        if not fields:
            raise self.err("payload has no fields", payloads[0].span)
        enc = next(d for d in decls if isinstance(d, ast.EncodeDecl))
        dec = next(d for d in decls if isinstance(d, ast.DecodeDecl))
        encode = self._encode(enc, top, state, fields)
        self.hidden_state = {s.name for s in state}
        decode = self._decode(dec, top, fields)
        return ir.Program(
            name=algo[0].name,
            doc=algo[0].doc,
            params=tuple(params),
            state=tuple(state),
            payload=tuple(fields),
            encode=encode,
            decode=decode,
        )

    def _recursion_check(self) -> None:
        """Every function, called or not: none may call itself, directly or through others."""
        calls = {name: _called(fn.body, self.fns) for name, fn in self.fns.items()}
        for start in self.fns:
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
                    raise self.err(
                        f"function `{start}` calls itself{how}; recursion is not supported",
                        calls[path[-1]][start].span,
                    )
                if nxt not in path and len(path) <= len(self.fns):
                    path.append(nxt)
                    stack.append(iter(sorted(calls[nxt])))

    def _declare(self, scope: Scope, name: str, span: Span) -> None:
        if name in scope.names:
            raise self.err(f"`{name}` is already defined", span)
        if name in BUILTINS or name in SCALAR_TYPES:
            raise self.err(f"`{name}` is a builtin name and cannot be redefined", span)

    # -- parameters

    def _params(self, decls: tuple[ast.Decl, ...], top: Scope) -> list[tuple[str, Any]]:
        declared = [d for d in decls if isinstance(d, ast.ParamDecl)]
        names = {d.name for d in declared}
        unknown = sorted(set(self.values) - names)
        if unknown:
            have = ", ".join(sorted(names)) or "none"
            raise CllParamError(
                f"unknown parameter `{unknown[0]}` (this algorithm's parameters: {have})",
                self.src,
                None,
            )
        out = []
        for d in declared:
            self._declare(top, d.name, d.span)
            t = self._type(d.type, top)
            if not isinstance(t, DType) or t.name not in PARAM_TYPES:
                raise self.err(
                    f"parameter type must be one of {', '.join(PARAM_TYPES)}", d.type.span
                )
            default = self._const_value(d.default, top, t)
            allowed = self._constraint(d, top, t)
            if not self._allowed(default, allowed):
                raise self.err(
                    f"default {default!r} of `{d.name}` is outside its allowed values "
                    f"{self._describe_allowed(allowed)}",
                    d.default.span,
                )
            if d.name in self.values:
                value = self._check_param_value(d, t, self.values[d.name], allowed)
            else:
                value = default
            out.append((d.name, value))
            top.names[d.name] = Binding(Scalar(ir.Const(value, t)), "param")
        return out

    def _constraint(self, d: ast.ParamDecl, top: Scope, t: DType) -> Any:
        c = d.constraint
        if c is None:
            return None
        if isinstance(c, ast.RangeConstraint):
            lo = self._const_value(c.lo, top, t)
            hi = self._const_value(c.hi, top, t)
            if lo > hi:
                raise self.err(f"empty range [{lo}, {hi}]", c.span)
            return ("range", lo, hi)
        return ("set", tuple(self._const_value(v, top, t) for v in c.values))

    @staticmethod
    def _allowed(v: Any, allowed: Any) -> bool:
        if allowed is None:
            return True
        if allowed[0] == "range":
            return allowed[1] <= v <= allowed[2]
        return v in allowed[1]

    @staticmethod
    def _describe_allowed(allowed: Any) -> str:
        if allowed is None:
            return "(any)"
        if allowed[0] == "range":
            return f"[{allowed[1]}, {allowed[2]}]"
        return "{" + ", ".join(repr(v) for v in allowed[1]) + "}"

    def _check_param_value(self, d: ast.ParamDecl, t: DType, v: Any, allowed: Any) -> Any:
        # every rejection names the parameter and, when it has one, its allowed values
        rng = "" if allowed is None else f" (allowed values {self._describe_allowed(allowed)})"

        def bad(msg: str) -> CllParamError:
            return CllParamError(f"parameter `{d.name}` {msg}{rng}", self.src, d.span)

        if t.is_bool:
            if not isinstance(v, bool):
                raise bad(f"must be a bool, got {v!r}")
        elif t.is_int:
            whole = isinstance(v, int) or (
                isinstance(v, float) and math.isfinite(v) and v == int(v)
            )
            if isinstance(v, bool) or not whole:
                raise bad(f"must be an integer ({t}), got {v!r}")
            v = int(v)
            lo, hi = semantics.int_range(t)
            if not lo <= v <= hi:
                raise bad(f"= {v} does not fit {t}")
        else:
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise bad(f"must be a number, got {v!r}")
            try:
                v = float(v)
            except OverflowError:
                raise bad(
                    f"is a {len(str(abs(v)))}-digit integer, beyond the float range"
                ) from None
            if v != v:
                raise bad("must not be NaN")
            if t == F32:
                v = float(torch.tensor(v, dtype=torch.float32).item())
        if not self._allowed(v, allowed):
            raise CllParamError(
                f"parameter `{d.name}` = {v!r} is outside its allowed values "
                f"{self._describe_allowed(allowed)}",
                self.src,
                d.span,
            )
        return v

    def _const_value(self, e: ast.Expr, scope: Scope, t: DType | None) -> Any:
        ctx = _Ctx(host=True, in_encode=False, ops=[])
        v = self._scalar(e, scope, ctx)
        if t is not None:
            v = self._coerce(v, t, e.span)
        if not isinstance(v.expr, ir.Const) or ctx.ops:
            raise self.err("expected a constant expression", e.span)
        if t == F32:  # bounds, defaults and values are all compared as f32
            return float(torch.tensor(float(v.expr.value), dtype=torch.float32).item())
        return v.expr.value

    def _const(self, d: ast.ConstDecl, top: Scope) -> Scalar:
        ctx = _Ctx(host=True, in_encode=False, ops=[])
        v = self._scalar(d.value, top, ctx)
        if d.type is not None:
            t = self._type(d.type, top)
            if not isinstance(t, DType):
                raise self.err("a const must be a scalar", d.type.span)
            v = self._coerce(v, t, d.value.span)
        elif v.lit:
            v = Scalar(v.expr)
        self._static(v.expr, d.value.span, "a const")
        return Scalar(v.expr)

    def _static(self, e: ir.Expr, span: Span, what: str) -> None:
        bad = refs(e) - {ir.N}
        if bad:
            shown = ", ".join(sorted(f"`{r}`" for r in bad))
            raise self.err(
                f"{what} must be computable from n and the parameters (it uses {shown})", span
            )

    # -- types

    def _type(self, t: ast.TypeAnn, scope: Scope) -> DType | ArrayType:
        if isinstance(t, ast.ScalarTypeAnn):
            if t.name not in SCALAR_TYPES:
                raise self.err(
                    f"unknown type `{t.name}` (types: {', '.join(SCALAR_TYPES)})", t.span
                )
            return SCALAR_TYPES[t.name]
        if isinstance(t, ast.ArrayTypeAnn):
            if t.elem not in SCALAR_TYPES:
                raise self.err(f"unknown element type `{t.elem}`", t.span)
            return ArrayType(SCALAR_TYPES[t.elem], self._size(t.length, scope))
        bits_v = self._scalar(t.bits, scope, _Ctx(True, False, []))
        if not isinstance(bits_v.expr, ir.Const) or bits_v.expr.value not in PACKED_BITS:
            shown = bits_v.expr.value if isinstance(bits_v.expr, ir.Const) else "not a constant"
            raise self.err(
                f"packed width must be a constant 1, 2, 4 or 8 (got {shown})", t.bits.span
            )
        return ArrayType(U8, self._size(t.length, scope), int(bits_v.expr.value))

    def _size(self, e: ast.Expr, scope: Scope, ctx: _Ctx | None = None) -> ir.Expr:
        v = self._scalar(e, scope, ctx or _Ctx(True, False, []))
        if not (v.dtype.is_int):
            raise self.err(f"array length must be an integer, got {v.dtype}", e.span)
        x = fold(ir.Cast(v.expr, I64)) if v.dtype != I64 else v.expr
        self._static(x, e.span, "an array length")
        if isinstance(x, ir.Const) and int(x.value) < 0:
            raise self.err(f"array length {x.value} is negative", e.span)
        return x

    # -- encode / decode

    def _encode(
        self, d: ast.EncodeDecl, top: Scope, state: list[ir.Slot], fields: list[ir.Slot]
    ) -> ir.Encode:
        scope = Scope(top)
        self.used[d.arg] = 1
        scope.names[d.arg] = Binding(Array(d.arg, ArrayType(F32, N_REF)), "let")
        for s in state:
            v: Value = (
                Array(s.name, s.type)
                if isinstance(s.type, ArrayType)
                else Scalar(ir.Ref(s.name, s.type))
            )
            scope.names[s.name] = Binding(v, "state")
        ctx = _Ctx(host=True, in_encode=True, ops=[])
        ret = self._host_block(d.body, scope, ctx, "encode")
        if not (isinstance(ret.value, ast.Call) and ret.value.func == "concat"):
            raise self.err("encode must end with `return concat(...)`", ret.value.span)
        outs = self._concat(ret.value, scope, ctx, fields)
        return ir.Encode(d.arg, tuple(ctx.ops), tuple(outs))

    def _decode(self, d: ast.DecodeDecl, top: Scope, fields: list[ir.Slot]) -> ir.Decode:
        scope = Scope(top)
        self.used[d.arg] = 1
        items: list[Scalar | Array] = []
        for f in fields:
            name = f"{d.arg}.{f.name}"
            items.append(
                Array(name, f.type)
                if isinstance(f.type, ArrayType)
                else Scalar(ir.Ref(name, f.type))
            )
        scope.names[d.arg] = Binding(Tuple_(tuple(items)), "payload")
        self.payload_fields = {f.name: it for f, it in zip(fields, items, strict=True)}
        self.payload_name = d.arg
        ctx = _Ctx(host=True, in_encode=False, ops=[])
        ret = self._host_block(d.body, scope, ctx, "decode")
        v = self._value(ret.value, scope, ctx, name_hint="out")
        want = ArrayType(F32, N_REF)
        if not isinstance(v, Array) or not same_type(v.type, want):
            got = v.type.describe() if isinstance(v, Array) else "a scalar"
            raise self.err(f"decode must return f32[n], got {got}", ret.value.span)
        return ir.Decode(d.arg, tuple(ctx.ops), v.name)

    def _host_block(self, body: ast.Block, scope: Scope, ctx: _Ctx, what: str) -> ast.Return:
        stmts = body.stmts
        for s in stmts[:-1]:
            if isinstance(s, ast.Return):
                raise self.err("`return` must be the last statement of its block", s.span)
        if not stmts or not isinstance(stmts[-1], ast.Return):
            raise self.err(f"{what} must end with a return statement", body.span)
        for s in stmts[:-1]:
            self._stmt(s, scope, ctx)
        return stmts[-1]

    def _concat(
        self, call: ast.Call, scope: Scope, ctx: _Ctx, fields: list[ir.Slot]
    ) -> list[str | ir.Expr]:
        if len(call.args) != len(fields):
            names = ", ".join(f.name for f in fields)
            raise self.err(
                f"concat takes one argument per payload field ({names}): "
                f"expected {len(fields)}, got {len(call.args)}",
                call.span,
            )
        outs: list[str | ir.Expr] = []
        for a, f in zip(call.args, fields, strict=True):
            if isinstance(f.type, DType):
                v = self._scalar(a, scope, ctx)
                outs.append(self._coerce(v, f.type, a.span).expr)
                continue
            hint_t = f.type
            v2 = self._value(a, scope, ctx, name_hint=f.name, expect=hint_t)
            if not isinstance(v2, Array) or not same_type(v2.type, f.type):
                got = v2.type.describe() if isinstance(v2, Array) else "a scalar"
                hint = ""
                if f.type.bits is not None:
                    hint = f"; declare it with `let {f.name}: {f.type.describe()} = map(...)`"
                raise self.err(
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
    return Elaborator(source, module, params).run()


def check_source(source: SourceFile, params: Mapping[str, Any] | None = None) -> ir.Program:
    """Parse and elaborate ``source``; see :func:`elaborate`."""
    return elaborate(source, parse(source), params or {})


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
