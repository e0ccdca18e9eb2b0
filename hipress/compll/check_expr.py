"""Elaboration of expressions, calls and lambdas (a mixin of the body checker)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hipress.compll import ast, ir
from hipress.compll.check_bits import BIT_BUILTINS
from hipress.compll.source import CllTypeError, Span
from hipress.compll.types import BOOL, F32, I64, SCALAR_TYPES, U32, ArrayType, DType

if TYPE_CHECKING:
    from hipress.compll.check_body import Scalar, Scope, Value, _Ctx


_UNARY = {"-": "neg", "!": "not", "~": "bnot"}


MAX_CALL_DEPTH = 32  # functions are inlined: a chain of calls nests that deep


class ExprChecker:
    """Scalar and array expressions. Mixed into :class:`BodyChecker`."""

    # ---------------------------------------------------------------- values

    def _value(
        self,
        e: ast.Expr,
        scope: Scope,
        ctx: _Ctx,
        name_hint: str = "t",
        expect: ArrayType | None = None,
        names: tuple[str, ...] | None = None,
    ) -> Value:
        from hipress.compll.check_body import PARALLEL, Array, Tuple_

        if isinstance(e, ast.Call) and e.func in PARALLEL:
            return self._parallel(e, scope, ctx, name_hint, expect, names)
        if isinstance(e, ast.Call) and e.func == "extract":
            b = scope.lookup(e.args[0].id) if e.args and isinstance(e.args[0], ast.Name) else None
            if len(e.args) != 1 or b is None or b.kind != "payload":
                raise self.err("extract takes the payload argument of decode", e.span)
            return b.value
        if isinstance(e, ast.Call) and e.func == "concat":
            raise self.err("concat is only allowed as `return concat(...)` in encode", e.span)
        if isinstance(e, ast.Name):
            b = scope.lookup(e.id)
            if b is not None and isinstance(b.value, Array | Tuple_) and b.kind != "payload":
                return b.value
        if isinstance(e, ast.Field):
            v = self._field(e, scope, ctx)
            if v is not None:
                return v
        return self._scalar(e, scope, ctx)

    def _array(self, e: ast.Expr, scope: Scope, ctx: _Ctx, what: str):
        from hipress.compll.check_body import Array

        if isinstance(e, ast.Lambda):
            raise self.err(f"{what} expects an array here, not a lambda", e.span)
        v = self._value(e, scope, ctx)
        if not isinstance(v, Array):
            raise self.err(f"{what} expects an array here, got a scalar", e.span)
        return v

    def _field(self, e: ast.Field, scope: Scope, ctx: _Ctx) -> Value | None:
        from hipress.compll.check_body import Array, Scalar

        if isinstance(e.base, ast.Name):
            b = scope.lookup(e.base.id)
            if b is not None and b.kind == "payload":
                fields = self.payload_fields  # type: ignore[attr-defined]
                if e.name not in fields:
                    have = ", ".join(fields)
                    raise self.err(f"payload has no field `{e.name}` (fields: {have})", e.span)
                return fields[e.name]
        if e.name == "size":
            base = self._value(e.base, scope, ctx)
            if isinstance(base, Array):
                return Scalar(base.type.length)
            raise self.err("`.size` applies to arrays only", e.span)
        raise self.err(f"unknown field `{e.name}` (arrays have `.size`)", e.span)

    # ---------------------------------------------------------------- scalars

    def _scalar(self, e: ast.Expr, scope: Scope, ctx: _Ctx) -> Scalar:
        from hipress.compll.check_body import Array, Scalar, Tuple_, fold

        if isinstance(e, ast.Number):
            if e.is_float:
                return Scalar(ir.Const(float(e.value), F32), True)
            return Scalar(ir.Const(int(e.value), I64), True)
        if isinstance(e, ast.Bool):
            return Scalar(ir.Const(e.value, BOOL))
        if isinstance(e, ast.Name):
            b = scope.lookup(e.id)
            hidden = b is None or b.kind == "builtin"  # a state named `inf` hides the constant
            if hidden and e.id in getattr(self, "hidden_state", ()):
                raise self.err(
                    f"state `{e.id}` is only available in encode (decode must be a pure "
                    "function of the payload)",
                    e.span,
                )
            if b is None:
                raise self.err(f"unknown name `{e.id}`{self._suggest(e.id, scope)}", e.span)
            if isinstance(b.value, Array):
                raise self.err(
                    f"`{e.id}` is an array ({b.value.type.describe()}); index it like "
                    f"`{e.id}[i]` or reduce it",
                    e.span,
                )
            if isinstance(b.value, Tuple_):
                raise self.err(f"`{e.id}` is the payload; read its fields like `{e.id}.x`", e.span)
            return b.value
        if isinstance(e, ast.Index):
            arr = self._array(e.base, scope, ctx, "indexing")
            idx = self._scalar(e.index, scope, ctx)
            if not idx.dtype.is_int:
                raise self.err(f"an index must be an integer, got {idx.dtype}", e.index.span)
            ix = idx.expr if idx.dtype == I64 else fold(ir.Cast(idx.expr, I64))
            if isinstance(ix, ir.Const) and ix.dtype != I64:
                ix = ir.Const(int(ix.value), I64)
            return Scalar(ir.Load(arr.name, ix, arr.type.dtype))
        if isinstance(e, ast.Field):
            v = self._field(e, scope, ctx)
            if isinstance(v, Array):
                raise self.err(f"`{e.name}` is an array; index it", e.span)
            assert v is not None
            return v
        if isinstance(e, ast.Unary):
            x = self._scalar(e.operand, scope, ctx)
            op = _UNARY[e.op]
            self._no_storage(x, e.span)
            if op == "neg" and not (x.dtype.is_int or x.dtype.is_float):
                raise self.err(f"`-` needs a number, got {x.dtype}", e.span)
            if op == "not" and x.dtype != BOOL:
                raise self.err(f"`!` needs a bool, got {x.dtype}", e.span)
            if op == "bnot" and not x.dtype.is_int:
                raise self.err(f"`~` needs an integer, got {x.dtype}", e.span)
            return Scalar(fold(ir.Unary(op, x.expr, x.dtype)), x.lit)
        if isinstance(e, ast.Binary):
            left = self._scalar(e.left, scope, ctx)
            right = self._scalar(e.right, scope, ctx)
            return self._binary(e.op, left, right, e.span)
        if isinstance(e, ast.Cond):
            c = self._scalar(e.cond, scope, ctx)
            if c.dtype != BOOL:
                raise self.err(f"condition must be bool, got {c.dtype}", e.cond.span)
            a, b = self._unify(
                self._scalar(e.then, scope, ctx), self._scalar(e.other, scope, ctx), e.span, "?:"
            )
            return Scalar(fold(ir.Select(c.expr, a.expr, b.expr, a.dtype)), a.lit and b.lit)
        if isinstance(e, ast.Call):
            return self._call(e, scope, ctx)
        if isinstance(e, ast.Lambda):
            raise self.err(
                "a lambda is only allowed as an argument of map, reduce, filter, topk, sort "
                "or scan",
                e.span,
            )
        raise self.err("unsupported expression", getattr(e, "span", None))  # pragma: no cover

    def _no_storage(self, x: Scalar, span: Span) -> None:
        if x.dtype.storage_only:
            raise self.err(f"{x.dtype} is a storage type; convert it first, e.g. f32(x)", span)

    def _binary(self, sym: str, left: Scalar, right: Scalar, span: Span) -> Scalar:
        from hipress.compll.check_body import _BINOPS, _CMP, Scalar, fold

        op = _BINOPS[sym]
        self._no_storage(left, span)
        self._no_storage(right, span)
        if op in ("shl", "shr"):
            if not (left.dtype.is_int and right.dtype.is_int):
                raise self.err(f"`{sym}` needs integers, got {left.dtype} and {right.dtype}", span)
            if left.lit and not right.lit:
                left = self._coerce(left, right.dtype, span)
            r = right.expr if right.dtype == left.dtype else fold(ir.Cast(right.expr, left.dtype))
            lit = left.lit and right.lit
            return Scalar(fold(ir.Binary(op, left.expr, r, left.dtype)), lit)
        left, right = self._unify(left, right, span, sym)
        dt = left.dtype
        lit = left.lit and right.lit
        if op in ("and", "or"):
            if dt != BOOL:
                raise self.err(f"`{sym}` needs bools, got {dt}", span)
            return Scalar(fold(ir.Binary(op, left.expr, right.expr, BOOL)))
        if op in _CMP:
            if dt == BOOL and op not in ("eq", "ne"):
                raise self.err(f"`{sym}` cannot compare bools", span)
            return Scalar(fold(ir.Binary(op, left.expr, right.expr, BOOL)))
        if op in ("band", "bor", "bxor"):
            if not (dt.is_int or dt == BOOL):
                raise self.err(f"`{sym}` needs integers or bools, got {dt}", span)
            return Scalar(fold(ir.Binary(op, left.expr, right.expr, dt)), lit)
        if not (dt.is_int or dt.is_float):
            raise self.err(f"`{sym}` needs numbers, got {dt}", span)
        return Scalar(fold(ir.Binary(op, left.expr, right.expr, dt)), lit)

    # ---------------------------------------------------------------- calls

    def _call(self, e: ast.Call, scope: Scope, ctx: _Ctx) -> Scalar:
        from hipress.compll.check_body import MATH1, PARALLEL, RANDOM, Scalar, fold

        f, args = e.func, e.args
        if f in SCALAR_TYPES:
            self._arity(e, 1)
            x = self._scalar(args[0], scope, ctx)
            t = SCALAR_TYPES[f]
            if x.dtype == t:
                return Scalar(x.expr)
            if x.lit and isinstance(x.expr, ir.Const) and t.is_int and x.dtype.is_int:
                from hipress.compll.semantics import int_range

                lo, hi = int_range(t)
                if not lo <= int(x.expr.value) <= hi:
                    wrapped = fold(ir.Cast(ir.Const(int(x.expr.value), x.dtype), t))
                    shown = getattr(wrapped, "value", "?")
                    raise self.err(
                        f"{f}({x.expr.value}): {x.expr.value} is out of range for {t} ({lo} to "
                        f"{hi}); the conversion would wrap it to {shown}: write that if it "
                        "is meant",
                        e.span,
                    )
            return Scalar(fold(ir.Cast(self._concrete(x).expr, t)))
        if f in MATH1:
            self._arity(e, 1)
            x = self._scalar(args[0], scope, ctx)
            self._no_storage(x, e.span)
            floats_only = f in (
                "floor",
                "ceil",
                "round",
                "trunc",
                "sqrt",
                "isnan",
                "isinf",
                "isfinite",
            )
            if floats_only and x.lit:
                x = self._coerce(x, F32, e.span)
            if floats_only and not x.dtype.is_float:
                raise self.err(f"`{f}` needs a float, got {x.dtype}", e.span)
            if not (x.dtype.is_float or x.dtype.is_int):
                raise self.err(f"`{f}` needs a number, got {x.dtype}", e.span)
            out = BOOL if f.startswith("is") else x.dtype
            return Scalar(fold(ir.Unary(f, x.expr, out)), x.lit and out != BOOL)
        if f in BIT_BUILTINS:
            return self._bits_call(e, scope, ctx)
        if f in ("min", "max"):
            if len(args) != 2:
                raise self.err(
                    f"`{f}(a, b)` takes 2 scalars; to reduce an array use `reduce({f}, arr)`",
                    e.span,
                )
            a, b = (self._scalar(x, scope, ctx) for x in args)
            a, b = self._unify(a, b, e.span, f)
            self._no_storage(a, e.span)
            return Scalar(fold(ir.Binary(f, a.expr, b.expr, a.dtype)), a.lit and b.lit)
        if f == "clamp":
            self._arity(e, 3)
            x, lo, hi = (self._scalar(a, scope, ctx) for a in args)
            x, lo = self._unify(x, lo, e.span, f)
            x, hi = self._unify(x, hi, e.span, f)
            lo, hi = self._unify(lo, hi, e.span, f)
            self._no_storage(x, e.span)
            m = fold(ir.Binary("max", x.expr, lo.expr, x.dtype))
            return Scalar(fold(ir.Binary("min", m, hi.expr, x.dtype)), x.lit)
        if f in RANDOM:
            return self._random(e, scope, ctx)
        if f in PARALLEL:
            if f == "reduce" and ctx.host and not ctx.no_parallel:
                v = self._parallel(e, scope, ctx, "r", None, None)
                assert isinstance(v, Scalar)
                return v
            if not ctx.host or ctx.no_parallel:
                raise self.err(
                    f"`{f}` is a parallel operator; it cannot be used inside a lambda or fn",
                    e.func_span,
                )
            raise self.err(f"`{f}` returns an array; bind it with `let`", e.span)
        if f in ("concat", "extract"):
            raise self.err(f"`{f}` is not allowed here", e.span)
        if f in self.fns:
            return self._inline(e, scope, ctx)
        raise self.err(f"unknown function `{f}`{self._suggest(f, scope)}", e.func_span)

    def _arity(self, e: ast.Call, n: int) -> None:
        if len(e.args) != n:
            raise self.err(f"`{e.func}` takes {n} argument(s), got {len(e.args)}", e.span)

    def _random(self, e: ast.Call, scope: Scope, ctx: _Ctx) -> Scalar:
        from hipress.compll.check_body import Scalar, fold

        if not ctx.in_encode:
            raise self.err(
                f"`{e.func}` is only available in encode (decode must be a pure function of "
                "the payload)",
                e.func_span,
            )
        want = 2 if e.func == "randint" else 1
        if len(e.args) not in (want, want + 1):
            raise self.err(
                f"`{e.func}` takes {want} argument(s) and an optional stream number", e.span
            )
        ctr = self._scalar(e.args[0], scope, ctx)
        if not ctr.dtype.is_int:
            raise self.err(f"the random counter must be an integer, got {ctr.dtype}", e.span)
        c = ctr.expr if ctr.dtype == I64 else fold(ir.Cast(ctr.expr, I64))
        stream = 0
        if len(e.args) == want + 1:
            s = self._scalar(e.args[-1], scope, ctx)
            if (
                not isinstance(s.expr, ir.Const)
                or not s.dtype.is_int
                or not 0 <= int(s.expr.value) < 65536
            ):
                raise self.err(
                    "the stream number must be a constant in [0, 65535]", e.args[-1].span
                )
            stream = int(s.expr.value)
        if e.func == "urand":
            return Scalar(ir.Rand("bits", c, stream, U32))
        if e.func == "uniform":
            return Scalar(ir.Rand("uniform", c, stream, F32))
        m = self._coerce(self._scalar(e.args[1], scope, ctx), I64, e.args[1].span)
        bits = ir.Cast(ir.Rand("bits", c, stream, U32), I64)
        return Scalar(ir.Binary("shr", ir.Binary("mul", bits, m.expr, I64), ir.Const(32, I64), I64))

    def _inline(self, e: ast.Call, scope: Scope, ctx: _Ctx) -> Scalar:
        from hipress.compll.check_body import Binding
        from hipress.compll.check_body import Scope as _Scope

        fn = self.fns[e.func]
        if e.func in self.fn_stack:
            raise self.err(f"function `{e.func}` calls itself; recursion is not supported", e.span)
        if len(self.fn_stack) >= MAX_CALL_DEPTH:
            chain = " -> ".join(f"`{f}`" for f in [*self.fn_stack[:3], "...", e.func])
            raise self.err(
                f"functions call each other more than {MAX_CALL_DEPTH} deep ({chain}); "
                "flatten the chain",
                e.span,
            )
        if len(e.args) != len(fn.params):
            raise self.err(
                f"`{fn.name}` takes {len(fn.params)} argument(s), got {len(e.args)}", e.span
            )
        fscope = _Scope(self.top, boundary=True)
        for p, a in zip(fn.params, e.args, strict=True):
            t = self._type(p.type, self.top)
            if not isinstance(t, DType):
                raise self.err("fn parameters must be scalars", p.span)
            v = self._coerce(self._scalar(a, scope, ctx), t, a.span)
            fscope.names[p.name] = Binding(self._emit_scalar(p.name, v, ctx), "let")
        ret_t = self._type(fn.ret, self.top)
        if not isinstance(ret_t, DType):
            raise self.err("fn must return a scalar", fn.ret.span)
        self.fn_stack.append(e.func)
        was = ctx.no_parallel
        ctx.no_parallel = True
        try:
            result = self._body(fn.body, fscope, ctx, f"fn `{fn.name}`")
        finally:
            self.fn_stack.pop()
            ctx.no_parallel = was
        return self._coerce(result, ret_t, fn.body.span)

    def _body(self, body: ast.Block | ast.Expr, scope: Scope, ctx: _Ctx, what: str) -> Scalar:
        if not isinstance(body, ast.Block):
            return self._scalar(body, scope, ctx)
        stmts = body.stmts
        for s in stmts[:-1]:
            if isinstance(s, ast.Return):
                raise self.err("`return` must be the last statement of its block", s.span)
        if not stmts or not isinstance(stmts[-1], ast.Return):
            raise self.err(f"{what} must end with a return statement", body.span)
        for s in stmts[:-1]:
            self._stmt(s, scope, ctx)
        return self._scalar(stmts[-1].value, scope, ctx)

    def _lambda(
        self, e: ast.Expr, ptypes: tuple[DType, ...], scope: Scope, ctx: _Ctx, what: str
    ) -> ir.Lambda:
        from hipress.compll.check_body import Binding, Scalar, _Ctx
        from hipress.compll.check_body import Scope as _Scope

        shape = "i => ..." if len(ptypes) == 1 else "(a, b) => ..."
        if not isinstance(e, ast.Lambda):
            raise self.err(f"{what} expects a lambda `{shape}` here", e.span)
        if len(e.params) != len(ptypes):
            raise self.err(
                f"{what} expects a lambda of {len(ptypes)} parameter(s) `{shape}`", e.span
            )
        lscope = _Scope(scope, boundary=True)
        lets: list[tuple[str, ir.Expr]] = []
        lctx = _Ctx(host=False, in_encode=ctx.in_encode, ops=lets)
        params = []
        for name, t in zip(e.params, ptypes, strict=True):
            r = ir.Ref(self.fresh(name), t)
            lscope.names[name] = Binding(Scalar(r), "let")
            params.append(r)
        result = self._concrete(self._body(e.body, lscope, lctx, "a lambda"))
        return ir.Lambda(tuple(params), tuple(lets), result.expr)

    def _with_result(self, lam: ir.Lambda, result: ir.Expr) -> ir.Lambda:
        return ir.Lambda(lam.params, lam.lets, result)

    # placeholders resolved by the other mixins
    def err(self, msg: str, span: Span | None) -> CllTypeError:  # pragma: no cover
        raise NotImplementedError
