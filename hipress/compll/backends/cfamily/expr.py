"""IR expressions -> C expressions and statements (shared by the C-family targets).

Every expression is pure and total (loads are bounds-checked, integer division by zero is
defined), so sub-expressions may be hoisted into statements and evaluated unconditionally.
Scalar operations are spelled by the operation table
(:mod:`hipress.compll.backends.cfamily.syntax`); the bit casts by
:mod:`hipress.compll.backends.cfamily.bits`; loop-index fast paths by
:mod:`hipress.compll.backends.cfamily.index`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from hipress.compll.backends.cfamily import bits as render_bits
from hipress.compll.backends.cfamily import syntax
from hipress.compll.backends.cfamily.body import Body, Mem
from hipress.compll.backends.cfamily.index import (
    fast_division,
    is_segment_index,
    rotation,
    segment_runs,
)
from hipress.compll.backends.cfamily.syntax import (
    BinaryRule,
    Names,
    UnaryRule,
    cast,
    const,
    ctype,
    is_ident,
)
from hipress.compll.ir import nodes as ir
from hipress.compll.ir import ops
from hipress.compll.ir.types import DType
from hipress.compll.ir.walk import walk
from hipress.compll.lower.kernel_plan import KernelPlan

_MINMAX = (ops.MIN.name, ops.MAX.name)
_DIVISIONS = (ops.DIV.name, ops.MOD.name)


def _minmax_const(e: ir.Binary) -> tuple[ir.Const, bool] | None:
    """For ``min``/``max`` of a float and a constant that is neither NaN nor zero: the
    constant and whether it is the first operand. Then the result is one compare and select
    (the constant when it wins or is equal: the same value; else the other operand, NaN
    included), where the general helpers also order -0 < +0 and propagate either NaN."""
    for c, first in ((e.a, True), (e.b, False)):
        if isinstance(c, ir.Const) and c.value == c.value and c.value != 0:
            return c, first
    return None


def _plus_zero(e: ir.Expr) -> bool:
    """Whether ``e`` is the constant +0.0."""
    return isinstance(e, ir.Const) and e.value == 0 and math.copysign(1.0, e.value) > 0


class Emitter:
    """Emits the statements of lambdas and host expressions for one plan; scalar operations
    by the rules of :data:`UNARY` and :data:`BINARY` (a target's emitter may override
    entries)."""

    UNARY: Mapping[str, UnaryRule] = syntax.UNARY
    BINARY: Mapping[str, BinaryRule] = syntax.BINARY

    def __init__(
        self,
        plan: KernelPlan,
        names: Names,
        mem: dict[str, Mem],
        lengths: dict[str, str],
        register: Callable[[ir.Expr], str] | None = None,
    ):
        self.plan = plan
        self.names = names
        self.mem = mem  # stored / input arrays
        self.lengths = lengths  # repr(length expr) -> C variable
        self.register = register  # makes the C variable of a length not seen yet
        # arrays a block(...) section keeps in its own buffers: name -> their read rule
        self.local: dict[str, Callable[[ir.Load, Body, dict[str, str]], str]] = {}

    def length(self, e: ir.Expr) -> str:
        got = self.lengths.get(repr(e))
        if got is None and self.register is not None:
            return self.register(e)
        return self.lengths[repr(e)]

    # -- lambdas

    def apply(
        self, fn: ir.Lambda, args: list[str], body: Body, env: dict[str, str] | None = None
    ) -> str:
        """Emit ``fn``'s lets into ``body`` with params bound to ``args``; return its result."""
        env = dict(env or {})
        for p, a in zip(fn.params, args, strict=True):
            if is_ident(a):
                env[p.name] = a
            else:
                v = self.names.fresh("a")
                body.lines.append(f"const {ctype(p.dtype)} {v} = {a};")
                env[p.name] = v
        for name, value in fn.lets:
            v = self.names.fresh("l")
            body.lines.append(f"const {ctype(value.dtype)} {v} = {self.expr(value, body, env)};")
            env[name] = v
        return self.expr(fn.result, body, env)

    # -- expressions

    def expr(self, e: ir.Expr, body: Body, env: dict[str, str]) -> str:
        if isinstance(e, ir.Const):
            return const(e.value, e.dtype)
        if body.index is not None and _costly(e) and self.invariant(e, env):
            return self._hoisted(e, body)
        if isinstance(e, ir.Ref):
            if e.name in env:
                return env[e.name]
            if e.name == ir.N:
                return "n"
            return self.names.get(e.name)
        if isinstance(e, ir.Load):
            return self.load(e, body, env)
        if isinstance(e, ir.Unary):
            if e.op in render_bits.UNARY:
                bind = self._binder(body)
                return render_bits.unary(e.op, self.expr(e.x, body, env), e.x.dtype, bind)
            return self.unary(e.op, self.expr(e.x, body, env), e.x.dtype)
        if isinstance(e, ir.Binary):
            a = self.expr(e.a, body, env)
            b = self.expr(e.b, body, env)
            if e.op == ops.LDEXP.name:
                return render_bits.ldexp(a, b, e.dtype, self._binder(body))
            if e.op == ops.HASH.name:
                tile = body.tile if body.aligned and b == body.index else None
                return render_bits.hash32(a, b, self._binder(body), tile)
            if e.op == ops.MOD.name and e.a.dtype.name == "i64" and body.tile is not None:
                rot = rotation(self, e, f"{a} % {b}", body, env)
                if rot is not None:
                    res = f"({rot.flag} ? {rot.var} : {self.binary(e.op, a, b, e.a.dtype)})"
                    body.rot_results[res] = rot
                    return res
            mc = _minmax_const(e) if e.op in _MINMAX and e.dtype.is_float else None
            if mc is not None and e.dtype.name in ("f32", "f64"):
                k, x = const(mc[0].value, e.dtype), (b if mc[1] else a)
                if not is_ident(x):
                    v = self.names.fresh("m")
                    body.lines.append(f"const {ctype(e.dtype)} {v} = {x};")
                    x = v
                cmp = ">=" if e.op == ops.MAX.name else "<="
                return f"hp_sel_{e.dtype.name}(({k} {cmp} {x}), {k}, {x})"
            if e.op == ops.SUB.name and e.dtype.name in ("f32", "f64") and _plus_zero(e.a):
                # gcc 12 folds 0 - x to -x where x cannot be -0 (an integer converted, a fabs),
                # which gives -0 for x = +0; IEEE's 0 - x is -x but +0 for either zero
                if not is_ident(b):
                    v = self.names.fresh("z")
                    body.lines.append(f"const {ctype(e.dtype)} {v} = {b};")
                    b = v
                zero = const(0.0, e.dtype)
                return f"hp_sel_{e.dtype.name}(({b} == {zero}), {zero}, (-{b}))"
            if e.op in _DIVISIONS and e.a.dtype.name == "i64" and body.index is not None:
                flag = fast_division(self, e, body, env)
                if flag is not None:
                    fast = f"hp_f{e.op}_i64({a}, {b})"
                    return f"({flag} ? {fast} : {self.binary(e.op, a, b, e.a.dtype)})"
            return self.binary(e.op, a, b, e.a.dtype)
        if isinstance(e, ir.Select):
            c = self.expr(e.cond, body, env)
            a = self.expr(e.a, body, env)
            b = self.expr(e.b, body, env)
            return f"hp_sel_{e.dtype.name}({c}, {a}, {b})"
        if isinstance(e, ir.Cast):
            return cast(self.expr(e.x, body, env), e.x.dtype, e.dtype)
        if isinstance(e, ir.Rand):
            ctr = self.expr(e.counter, body, env)
            if body.tile is not None and ctr == body.index:
                buf = body.rand_tiles.setdefault(e.stream, self.names.fresh("rnd"))
                bits = f"{buf}[{body.tile}]"
            else:
                bits = f"hp_philox({ctr}, {e.stream}u, rk0, rk1, rstep, rtid)"
            return f"hp_uniform({bits})" if e.kind == "uniform" else bits
        raise TypeError(f"not an IR expression: {e!r}")

    def _binder(self, body: Body) -> render_bits.Bind:
        """Binds a C expression to a fresh constant in ``body`` (identifiers as they are)."""

        def bind(ctype_: str, text: str) -> str:
            if is_ident(text):
                return text
            v = self.names.fresh("bt")
            body.lines.append(f"const {ctype_} {v} = {text};")
            return v

        return bind

    def unary(self, op: str, x: str, dt: DType) -> str:
        """C for unary ``op`` of ``x`` (type ``dt``), by this target's :attr:`UNARY` rule."""
        rule = self.UNARY.get(op)
        if rule is None:
            raise ValueError(f"unknown unary op {op} on {dt}")
        return rule(x, dt)

    def binary(self, op: str, a: str, b: str, dt: DType) -> str:
        """C for binary ``op`` of ``a`` and ``b`` (operand type ``dt``), by this target's
        :attr:`BINARY` rule."""
        rule = self.BINARY.get(op)
        if rule is None:
            raise ValueError(f"unknown binary op {op} on {dt}")
        return rule(a, b, dt)

    def _hoisted(self, e: ir.Expr, body: Body) -> str:
        """A loop-invariant expression with a costly operation (a constant's ``sqrt``, a
        division), computed once before the loop instead of per element."""
        key = ("<hoisted>", repr(e))
        var = body.memo.get(key)
        if var is None:
            host = Body(level=body.level)
            code = self.expr(e, host, {})
            var = self.names.fresh("inv")
            body.hoist += [*host.hoist, *host.lines, f"const {ctype(e.dtype)} {var} = {code};"]
            body.memo[key] = var
        return var

    def invariant(self, e: ir.Expr, env: dict[str, str]) -> bool:
        """Whether ``e`` is the same on every iteration (host scalars and constants only)."""
        for x in walk(e):
            if isinstance(x, ir.Load | ir.Rand) or (isinstance(x, ir.Ref) and x.name in env):
                return False
        return True

    # -- array reads

    def load(self, x: ir.Load, body: Body, env: dict[str, str]) -> str:
        if x.array in self.local:
            return self.local[x.array](x, body, env)
        idx = self.expr(x.index, body, env)
        key = (x.array, idx)
        if key in body.memo:
            return body.memo[key]
        a = self.plan.arrays[x.array]
        seg = self._segment_read(x, body, env)
        if seg is not None:
            body.memo[key] = seg
            return seg
        rot = body.rot_results.get(idx)
        if rot is not None and repr(a.length) == rot.length:
            # unswitched: a contiguous read where the tile does not wrap, else the exact one
            fast = self._read(x, rot.var, body, direct=True)
            val = f"({rot.flag} ? {fast} : {self._read(x, idx, body)})"
        else:
            val = self._read(x, idx, body, direct=body.safe.get(idx) == repr(a.length))
        v = self.names.fresh("r")
        body.lines.append(f"const {ctype(a.dtype)} {v} = {val};")
        body.memo[key] = v
        return v

    def _segment_read(self, x: ir.Load, body: Body, env: dict[str, str]) -> str | None:
        """``x.array[index / d]`` (``d`` loop-invariant, the array in memory) in a tile loop:
        a tile buffer filled before the loop, one read per segment of ``d`` elements (instead
        of a gather per element); None if ``x`` is not such a read."""
        if body.tile is None or not is_segment_index(self, x, body.index, env):
            return None
        e = x.index
        assert isinstance(e, ir.Binary)
        plan = self.plan
        if self._inlined(x.array, body, aligned=False):
            return None
        host = Body(level=body.level)
        d = self.expr(e.b, host, {})
        if host.lines:  # pragma: no cover - invariant expressions read no arrays
            return None
        key = f"{x.array}/{d}/{body.tile}"
        buf = body.segments.get(key)
        if buf is None:
            buf = body.segments[key] = self.names.fresh("seg")
            a = plan.arrays[x.array]
            at = self._mem_read(x.array, "sq", False, host)
            runs = segment_runs("t")
            body.tile_pre += [
                f"{ctype(a.dtype)} {buf}[HP_TILE];",
                "{",
                f"  const int64_t sd = {d};",
                "  if (sd > 0 && i0 >= 0) {",
                f"    {runs[0]}",
                f"      {runs[1]}",
                f"      const {ctype(a.dtype)} sv = {at};",
                f"      for (; t < e; t++) {buf}[t] = sv;",
                "    }",
                "  } else {",
                "    for (int64_t t = 0; t < tl; t++) {",
                "      const int64_t sq = hp_div_i64(i0 + t, sd);",
                f"      {buf}[t] = {at};",
                "    }",
                "  }",
                "}",
            ]
        return f"{buf}[{body.tile}]"

    def _inlined(self, name: str, body: Body, aligned: bool) -> bool:
        """Whether a read of ``name`` in ``body`` recomputes its map instead of loading it."""
        plan = self.plan
        if plan.is_virtual(name) or name in body.recompute or plan.recomputed(name, body.level):
            return True
        return body.fuse and not body.copy and plan.inline_read(name, body.level, aligned)

    def _read(self, x: ir.Load, idx: str, body: Body, direct: bool = False) -> str:
        """C for ``x.array[idx]``; ``direct``: ``idx`` is known to be within the array."""
        plan = self.plan
        a = plan.arrays[x.array]
        aligned = body.index is not None and idx == body.index and a.length == body.loop_len
        if not self._inlined(x.array, body, aligned):
            return self._mem_read(x.array, idx, aligned, body, direct)
        m = plan.maps[x.array]
        if aligned or direct:
            return self.apply(m.fn, [idx], body)
        ix = idx
        if not is_ident(ix):
            ix = self.names.fresh("ix")
            body.lines.append(f"const int64_t {ix} = {idx};")
        inner = self.apply(m.fn, [ix], body)
        zero = const(0, a.dtype)
        ok = f"(uint64_t){ix} < (uint64_t){self.length(a.length)}"
        return f"hp_sel_{a.dtype.name}({ok}, {inner}, {zero})"

    def _mem_read(
        self, name: str, idx: str, aligned: bool, body: Body, direct: bool = False
    ) -> str:
        m = self.mem[name]
        if aligned and m.bits is not None and body.tile is not None and m.bits < 8:
            buf = body.unpacked.setdefault(name, self.names.fresh("unp"))
            return f"{buf}[{body.tile}]"
        ptr, at = m.ptr, idx
        if not aligned and not direct:
            if not is_ident(idx):
                ix = self.names.fresh("ix")
                body.lines.append(f"const int64_t {ix} = {idx};")
                idx = ix
            # read at an index clamped into range (always valid), select zero outside
            ptr, at = m.safe or m.ptr, f"hp_clampi({idx}, {m.length})"
        if m.bits is not None and m.bits < 8:
            per = 8 // m.bits
            sh = {1: 3, 2: 2, 4: 1}[m.bits]
            elem = (
                f"((uint8_t)(({ptr}[({at}) >> {sh}] >> ((({at}) & {per - 1}) * {m.bits})) "
                f"& {(1 << m.bits) - 1}))"
            )
        elif m.dtype.is_bool:
            elem = f"({ptr}[{at}] != 0)"
        else:
            elem = f"{ptr}[{at}]"
        if aligned or direct:
            return elem
        zero = const(0, m.dtype)
        return f"hp_sel_{m.dtype.name}((uint64_t){idx} < (uint64_t){m.length}, {elem}, {zero})"


def _costly(e: ir.Expr) -> bool:
    """Whether ``e`` holds an operation worth computing once: a square root or a division."""
    return any(
        (isinstance(x, ir.Unary) and x.op == ops.SQRT.name)
        or (isinstance(x, ir.Binary) and x.op in _DIVISIONS)
        for x in walk(e)
    )
