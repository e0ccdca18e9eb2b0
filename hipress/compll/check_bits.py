"""Elaboration of the builtins that see a float's representation (a mixin of the body checker):
the bit casts ``as_u32 as_i32 as_f32 as_i64 as_f64``, ``exponent`` and ``ldexp``.

They are exact on every backend, unlike ``log2``/``exp2``, which the language leaves out: torch,
libm and CUDA's fast math library round those differently (CUDA's ``log2f``/``exp2f`` are not
correctly rounded), and every backend must compute what the reference interpreter computes, bit
for bit. ``exponent`` and ``ldexp`` are the exact parts of ``log2`` and ``exp2``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hipress.compll import ast, ir
from hipress.compll.source import CllTypeError, Span
from hipress.compll.types import F32, F64, I32, I64, U32, DType

if TYPE_CHECKING:
    from hipress.compll.check_body import Scalar, Scope, _Ctx

# as_T(x): the bits of x read as T (x must have T's width)
BIT_CASTS: dict[str, DType] = {"as_u32": U32, "as_i32": I32, "as_f32": F32, "as_i64": I64,
                               "as_f64": F64}  # fmt: skip
BIT_BUILTINS = (*BIT_CASTS, "exponent", "ldexp")
_WIDTH = {32: "a 32-bit value (f32, i32 or u32)", 64: "a 64-bit value (f64 or i64)"}


class BitsChecker:
    """``as_T(x)``, ``exponent(x)``, ``ldexp(x, e)``. Mixed into :class:`BodyChecker`."""

    def _bits_call(self, e: ast.Call, scope: Scope, ctx: _Ctx) -> Scalar:
        from hipress.compll.check_body import Scalar, fold

        f = e.func
        if f == "ldexp":
            self._arity(e, 2)
            x = self._float_arg(e, e.args[0], scope, ctx)
            k = self._scalar(e.args[1], scope, ctx)
            if k.lit and k.dtype.is_int:
                k = self._coerce(k, I64, e.args[1].span)
            if not k.dtype.is_int:
                raise self.err(
                    f"the exponent of `ldexp(x, e)` must be an integer, got {k.dtype}; "
                    "convert it, e.g. i32(...)",
                    e.args[1].span,
                )
            ke = k.expr if k.dtype == I64 else fold(ir.Cast(k.expr, I64))
            return Scalar(fold(ir.Binary("ldexp", x.expr, ke, x.dtype)), x.lit and k.lit)
        self._arity(e, 1)
        if f == "exponent":
            x = self._float_arg(e, e.args[0], scope, ctx)
            return Scalar(fold(ir.Unary("exponent", x.expr, I32)))
        t = BIT_CASTS[f]
        x = self._scalar(e.args[0], scope, ctx)
        self._no_storage(x, e.span)
        if x.lit:
            x = self._literal_bits(f, x, t, e.args[0].span)
        if x.dtype.is_bool or x.dtype.bits != t.bits:
            convert = {32: "f32(...) or u32(...)", 64: "f64(...) or i64(...)"}[t.bits]
            raise self.err(
                f"`{f}` reinterprets the bits of {_WIDTH[t.bits]}, got {x.dtype}; convert it "
                f"first, e.g. {convert}",
                e.span,
            )
        if x.dtype == t:
            return Scalar(x.expr)
        if x.dtype.is_int and t.is_int:  # same width: the conversion keeps the bits
            return Scalar(fold(ir.Cast(x.expr, t)))
        return Scalar(fold(ir.Unary(f, x.expr, t)))

    def _float_arg(self, e: ast.Call, arg: ast.Expr, scope: Scope, ctx: _Ctx) -> Scalar:
        x = self._scalar(arg, scope, ctx)
        self._no_storage(x, e.span)
        if x.lit:
            x = self._coerce(x, F32, arg.span)
        if not x.dtype.is_float:
            raise self.err(
                f"`{e.func}` needs a float (f32 or f64), got {x.dtype}; convert it, e.g. f32(...)",
                arg.span,
            )
        return x

    def _literal_bits(self, f: str, x: Scalar, t: DType, span: Span) -> Scalar:
        """A literal argument takes the type whose bits ``as_T`` reads: the float of T's width
        for an integer T, else the integer of T's width that holds the value (u32 before i32)."""
        if t.is_int:
            return self._coerce(x, F32 if t.bits == 32 else F64, span)
        if not x.dtype.is_int:
            return x
        if t.bits == 64:
            return self._coerce(x, I64, span)
        v = getattr(x.expr, "value", None)
        if isinstance(v, int) and not -(1 << 31) <= v < (1 << 32):
            raise self.err(
                f"`{f}({v})`: {v} does not fit in 32 bits (u32 or i32); as_f32 reads the "
                "bits of a 32-bit integer",
                span,
            )
        return self._coerce(x, U32 if isinstance(v, int) and v >= 0 else I32, span)

    # provided by the other mixins
    def err(self, msg: str, span: Span | None) -> CllTypeError:  # pragma: no cover
        raise NotImplementedError

    def _scalar(self, e: ast.Expr, scope: Scope, ctx: _Ctx) -> Scalar:  # pragma: no cover
        raise NotImplementedError

    def _coerce(self, v: Scalar, t: DType, span: Span) -> Scalar:  # pragma: no cover
        raise NotImplementedError

    def _arity(self, e: ast.Call, n: int) -> None:  # pragma: no cover
        raise NotImplementedError

    def _no_storage(self, x: Scalar, span: Span) -> None:  # pragma: no cover
        raise NotImplementedError
