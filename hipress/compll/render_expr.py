"""IR expressions -> C expressions and statements (shared by the C and CUDA renderers).

Every expression is pure and total (loads are bounds-checked, integer division by zero is
defined), so sub-expressions may be hoisted into statements and evaluated unconditionally. The
helpers named here (``hp_add_i32``, ``hp_min_f32``, ``hp_philox``...) are defined by each
target's prelude template with the semantics of :mod:`hipress.compll.semantics`.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from hipress.compll import ir, render_bits
from hipress.compll.plan import Plan
from hipress.compll.types import DType

CTYPE = {
    "bool": "bool", "u8": "uint8_t", "u16": "uint16_t", "u32": "uint32_t", "i8": "int8_t",
    "i16": "int16_t", "i32": "int32_t", "i64": "int64_t", "f16": "uint16_t", "bf16": "uint16_t",
    "f32": "float", "f64": "double",
}  # fmt: skip
# the element type arrays of each dtype are stored as (bool arrays are bytes)
MTYPE = {**CTYPE, "bool": "uint8_t"}

INT_TYPES = ("u8", "u16", "u32", "i8", "i16", "i32", "i64")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def ctype(dt: DType) -> str:
    return CTYPE[dt.name]


def mtype(dt: DType) -> str:
    return MTYPE[dt.name]


class Names:
    """An injective map from SSA names to C identifiers, plus fresh temporaries."""

    def __init__(self) -> None:
        self._map: dict[str, str] = {}
        self._used: set[str] = set()
        self._k = 0

    def get(self, name: str, prefix: str = "s") -> str:
        key = f"{prefix}:{name}"
        if key not in self._map:
            base = f"{prefix}_" + re.sub(r"\W", "_", name)
            ident = base
            k = 1
            while ident in self._used:
                ident = f"{base}_{k}"
                k += 1
            self._used.add(ident)
            self._map[key] = ident
        return self._map[key]

    def fresh(self, base: str = "v") -> str:
        self._k += 1
        return f"{base}{self._k}"


@dataclass(frozen=True)
class Mem:
    """How to read a stored array: pointer, length variable, element type, packing.

    ``safe`` is a pointer that may be read at index 0 even when the array is empty (reads at
    other indices clamp into range and select zero, so they need no branch)."""

    ptr: str
    length: str
    dtype: DType
    bits: int | None
    safe: str = ""


@dataclass
class Body:
    """Statements of one scope (a loop body or host code) and what it may assume.

    ``index``: the loop index variable (reads at it, of arrays as long as ``loop_len``, need no
    bounds check); ``fuse``: whether stored maps of this ``level`` read at the index may be
    recomputed (loop items only); ``tile``: the tile offset variable when tile-local buffers
    may be used (unpacked packed arrays, random numbers by block of four).
    """

    level: int = 0
    index: str | None = None
    loop_len: ir.Expr | None = None
    fuse: bool = False
    tile: str | None = None
    copy: bool = False
    lines: list[str] = field(default_factory=list)
    hoist: list[str] = field(default_factory=list)  # host code to run before the loop
    memo: dict[tuple[str, str], str] = field(default_factory=dict)
    unpacked: dict[str, str] = field(default_factory=dict)  # array -> tile buffer
    rand_tiles: dict[int, str] = field(default_factory=dict)  # stream -> tile buffer
    # rotated indices ``(index + h) % len`` (tile loops): C text of the expression -> Rotation
    rotations: dict[str, Rotation] = field(default_factory=dict)
    tile_pre: list[str] = field(default_factory=list)  # per-tile code the rotations need
    rot_results: dict[str, Rotation] = field(default_factory=dict)  # C index expr -> Rotation
    safe: dict[str, str] = field(default_factory=dict)  # C index var -> repr(length) it is below
    segments: dict[str, str] = field(default_factory=dict)  # "array/divisor" -> tile buffer
    recompute: frozenset[str] = frozenset()  # stored maps this body computes (a filter's pass)


@dataclass(frozen=True)
class Rotation:
    """``(index + h) % length`` in a tile loop of ``length`` iterations: per tile, ``flag``
    holds when the tile does not wrap around, and then the index is ``index + delta`` (the
    variable ``var``, always within ``[0, length)``), so reads at it are contiguous."""

    flag: str
    var: str
    length: str  # repr of the length expression


def _sum(terms: list[ir.Expr]) -> ir.Expr:
    out = terms[0]
    for t in terms[1:]:
        out = ir.Binary("add", out, t, out.dtype)
    return out


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


def const(value: int | float | bool, dt: DType) -> str:
    """A C literal of exactly ``value`` as ``dt``."""
    if dt.is_bool:
        return "true" if value else "false"
    if dt.is_int:
        v = int(value)
        if dt.name == "i64":
            return "INT64_MIN" if v == -(1 << 63) else f"INT64_C({v})"
        if dt.name == "i32" and v == -(1 << 31):
            return "INT32_MIN"
        if dt.name == "u32":
            return f"UINT32_C({v})"
        return f"(({ctype(dt)}){v})"
    v = float(value)
    if dt.name in ("f16", "bf16"):
        tdt = torch.float16 if dt.name == "f16" else torch.bfloat16
        bits = int(torch.tensor(v, dtype=torch.float32).to(tdt).view(torch.int16).item()) & 0xFFFF
        return f"((uint16_t)0x{bits:04x})"
    if dt.name == "f32":
        if v != v:
            return "hp_f32_from_bits(0x7fc00000u)"
        if v in (float("inf"), float("-inf")):
            return "HP_INF_F" if v > 0 else "(-HP_INF_F)"
        v32 = struct.unpack("<f", struct.pack("<f", v))[0]
        return f"{v32.hex()}f"
    if v != v:
        return "hp_f64_from_bits(UINT64_C(0x7ff8000000000000))"
    if v in (float("inf"), float("-inf")):
        return "HP_INF_D" if v > 0 else "(-HP_INF_D)"
    return v.hex()


_FLOAT_UNARY = {"sqrt": "sqrt", "abs": "fabs"}
_CMP = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def _fsuf(dt: DType) -> str:
    return "f" if dt.name == "f32" else ""


def cast(x: str, src: DType, dst: DType) -> str:
    """C code converting ``x`` from ``src`` to ``dst`` with the semantics module's rules."""
    if src == dst:
        return x
    if src.name in ("f16", "bf16"):
        return cast(f"hp_{src.name}_to_f32({x})", _F32, dst)
    if dst.is_bool:
        return f"({x} != 0)"
    if dst.name in ("f16", "bf16"):
        if src.is_float and src.name == "f32":
            return f"hp_f32_to_{dst.name}({x})"
        return f"hp_f32_to_{dst.name}({cast(x, src, _F32)})"
    if dst.is_float:
        return f"(({ctype(dst)})({x}))"
    if src.is_float:
        return f"hp_{src.name}_to_{dst.name}({x})"
    return f"(({ctype(dst)})({x}))"


_F32 = DType("f32", "float", 32)


class Emitter:
    """Emits the statements of lambdas and host expressions for one plan."""

    def __init__(
        self,
        plan: Plan,
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
            if _IDENT.match(a):
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
        if body.index is not None and _costly(e) and self._invariant(e, env):
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
            if e.op == "ldexp":
                return render_bits.ldexp(a, b, e.dtype, self._binder(body))
            if e.op == "mod" and e.a.dtype.name == "i64" and body.tile is not None:
                rot = self._rotation(e, f"{a} % {b}", body, env)
                if rot is not None:
                    res = f"({rot.flag} ? {rot.var} : {self.binary(e.op, a, b, e.a.dtype)})"
                    body.rot_results[res] = rot
                    return res
            mc = _minmax_const(e) if e.op in ("min", "max") and e.dtype.is_float else None
            if mc is not None and e.dtype.name in ("f32", "f64"):
                k, x = const(mc[0].value, e.dtype), (b if mc[1] else a)
                if not _IDENT.match(x):
                    v = self.names.fresh("m")
                    body.lines.append(f"const {ctype(e.dtype)} {v} = {x};")
                    x = v
                cmp = ">=" if e.op == "max" else "<="
                return f"hp_sel_{e.dtype.name}(({k} {cmp} {x}), {k}, {x})"
            if e.op == "sub" and e.dtype.name in ("f32", "f64") and _plus_zero(e.a):
                # gcc 12 folds 0 - x to -x where x cannot be -0 (an integer converted, a fabs),
                # which gives -0 for x = +0; IEEE's 0 - x is -x but +0 for either zero
                if not _IDENT.match(b):
                    v = self.names.fresh("z")
                    body.lines.append(f"const {ctype(e.dtype)} {v} = {b};")
                    b = v
                zero = const(0.0, e.dtype)
                return f"hp_sel_{e.dtype.name}(({b} == {zero}), {zero}, (-{b}))"
            if e.op in ("div", "mod") and e.a.dtype.name == "i64" and body.index is not None:
                flag = self._fast_division(e, body, env)
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
            if _IDENT.match(text):
                return text
            v = self.names.fresh("bt")
            body.lines.append(f"const {ctype_} {v} = {text};")
            return v

        return bind

    def unary(self, op: str, x: str, dt: DType) -> str:
        if op == "not":
            return f"(!{x})"
        if op in ("neg", "bnot", "abs", "sign") and dt.is_int:
            return f"hp_{op}_{dt.name}({x})"
        if op == "neg":
            return f"(-{x})"
        if op == "sign":
            return f"hp_sign_{dt.name}({x})"
        if op in ("round", "floor", "ceil", "trunc"):
            return f"hp_{op}_{dt.name}({x})"
        if op == "isnan":
            return f"({x} != {x})"
        if op == "isinf":
            return f"(fabs{_fsuf(dt)}({x}) == {'HP_INF_F' if dt.name == 'f32' else 'HP_INF_D'})"
        if op == "isfinite":
            return f"(fabs{_fsuf(dt)}({x}) < {'HP_INF_F' if dt.name == 'f32' else 'HP_INF_D'})"
        if op in _FLOAT_UNARY:
            return f"{_FLOAT_UNARY[op]}{_fsuf(dt)}({x})"
        raise ValueError(f"unknown unary op {op} on {dt}")

    def binary(self, op: str, a: str, b: str, dt: DType) -> str:
        if op in _CMP:
            return f"({a} {_CMP[op]} {b})"
        if op in ("and", "or"):
            return f"((bool)({a} {'&' if op == 'and' else '|'} {b}))"
        if op in ("band", "bor", "bxor"):
            sym = {"band": "&", "bor": "|", "bxor": "^"}[op]
            return f"(({ctype(dt)})({a} {sym} {b}))"
        if dt.is_int:
            return f"hp_{op}_{dt.name}({a}, {b})"
        if op in ("add", "sub", "mul", "div"):
            sym = {"add": "+", "sub": "-", "mul": "*", "div": "/"}[op]
            return f"({a} {sym} {b})"
        if op == "mod":
            return f"fmod{_fsuf(dt)}({a}, {b})"
        if op in ("min", "max"):
            return f"hp_{op}_{dt.name}({a}, {b})"
        raise ValueError(f"unknown binary op {op} on {dt}")

    # -- fast 64-bit division (the loop is unswitched on a hoisted range check)

    def _fast_division(self, e: ir.Binary, body: Body, env: dict[str, str]) -> str | None:
        """A hoisted flag that holds when every dividend of ``e`` in this loop and its
        loop-invariant divisor are below 2^53 in magnitude (and the divisor is not 0): the
        dividend must be ``c * index + h`` with constant ``c`` and loop-invariant ``h``."""
        if isinstance(e.b, ir.Const):  # the C compiler strength-reduces constant divisors
            return None
        aff = self._affine(e.a, body, env)
        if aff is None or not self._invariant(e.b, env) or body.loop_len is None:
            return None
        coef, terms = aff
        if abs(coef) > 1024:
            return None
        host = Body(level=body.level)
        h = " + ".join(f"fabs((double)({self.expr(t, host, {})}))" for t in terms) or "0.0"
        d = self.expr(e.b, host, {})
        if host.lines:  # pragma: no cover - invariant expressions read no arrays
            return None
        flag = self.names.fresh("fastdiv")
        ln = self.length(body.loop_len)
        body.hoist.append(
            f"const bool {flag} = ({h}) <= 0x1p51 && {ln} <= (INT64_C(1) << 40) && ({d}) != 0 "
            f"&& fabs((double)({d})) < 0x1p53;"
        )
        return flag

    # -- rotated indices (the tile loop is unswitched on a per-tile "no wrap-around" flag)

    def _rotation(self, e: ir.Binary, key: str, body: Body, env: dict[str, str]) -> Rotation | None:
        """The :class:`Rotation` for ``e = (index + h) % d`` (C text ``key``), when ``h`` and
        ``d`` are loop-invariant and ``d`` is the loop's own length; registered in ``body``."""
        if key in body.rotations:
            return body.rotations[key]
        if body.loop_len is None or repr(e.b) != repr(body.loop_len):
            return None
        terms = self._index_plus(e.a, body, env)
        if terms is None or not self._invariant(e.b, env):
            return None
        host = Body(level=body.level)
        h = self.expr(_sum(terms), host, {}) if terms else "INT64_C(0)"
        d = self.expr(e.b, host, {})
        if host.lines:  # pragma: no cover - invariant expressions read no arrays
            return None
        k = self.names.fresh("rot")
        rot = Rotation(flag=f"rotok{k[3:]}", var=f"jr{k[3:]}", length=repr(e.b))
        # i0 + h wraps like the program's own add; below INT64_MAX - HP_TILE, adding t can't
        body.tile_pre += [
            f"const int64_t {k}s = hp_add_i64(i0, {h});",
            f"const bool {rot.flag} = {k}s >= 0 && {k}s <= INT64_MAX - HP_TILE && "
            f"{k}s % ({d}) + tl <= ({d});",
            f"const int64_t {k}d = {rot.flag} ? {k}s % ({d}) - i0 : 0;",
        ]
        body.lines.append(f"const int64_t {rot.var} = {body.index} + {k}d;")
        body.rotations[key] = rot
        body.safe[rot.var] = rot.length
        return rot

    def _index_plus(self, e: ir.Expr, body: Body, env: dict[str, str]) -> list[ir.Expr] | None:
        """``e`` as ``index + sum(terms)`` (i64 adds only, terms loop-invariant), or None."""
        if isinstance(e, ir.Ref) and env.get(e.name) == body.index:
            return []
        if isinstance(e, ir.Binary) and e.op == "add" and e.dtype.name == "i64":
            for x, y in ((e.a, e.b), (e.b, e.a)):
                if self._invariant(y, env):
                    inner = self._index_plus(x, body, env)
                    if inner is not None:
                        return [*inner, y]
        return None

    def _affine(
        self, e: ir.Expr, body: Body, env: dict[str, str]
    ) -> tuple[int, list[ir.Expr]] | None:
        """``e`` as ``c * index + sum(terms)`` (terms loop-invariant), or None."""
        if isinstance(e, ir.Ref) and env.get(e.name) == body.index:
            return 1, []
        if isinstance(e, ir.Binary) and e.op in ("add", "sub"):
            for x, y, sign_ok in ((e.a, e.b, True), (e.b, e.a, e.op == "add")):
                if sign_ok and self._invariant(y, env):
                    inner = self._affine(x, body, env)
                    if inner is not None:
                        return inner[0], [*inner[1], y]
            return None
        if isinstance(e, ir.Binary) and e.op == "mul":
            for x, y in ((e.a, e.b), (e.b, e.a)):
                if isinstance(y, ir.Const):
                    inner = self._affine(x, body, env)
                    if inner is not None and not inner[1]:
                        return inner[0] * int(y.value), []
        return None

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

    def _invariant(self, e: ir.Expr, env: dict[str, str]) -> bool:
        """Whether ``e`` is the same on every iteration (host scalars and constants only)."""
        from hipress.compll.walk import walk

        for x in walk(e):
            if isinstance(x, ir.Load | ir.Rand) or (isinstance(x, ir.Ref) and x.name in env):
                return False
        return True

    # -- array reads

    def load(self, x: ir.Load, body: Body, env: dict[str, str]) -> str:
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
        e = x.index
        if not (
            body.tile is not None
            and isinstance(e, ir.Binary)
            and e.op == "div"
            and e.dtype.name == "i64"
            and isinstance(e.a, ir.Ref)
            and env.get(e.a.name) == body.index
            and self._invariant(e.b, env)
        ):
            return None
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
            body.tile_pre += [
                f"{ctype(a.dtype)} {buf}[HP_TILE];",
                "{",
                f"  const int64_t sd = {d};",
                "  if (sd > 0 && i0 >= 0) {",
                "    for (int64_t t = 0; t < tl;) {",
                "      const int64_t sq = (i0 + t) / sd, rem = sd - (i0 + t) % sd;",
                "      const int64_t e = rem >= tl - t ? tl : t + rem;",
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
        if not _IDENT.match(ix):
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
            if not _IDENT.match(idx):
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
    from hipress.compll.walk import walk

    return any(
        (isinstance(x, ir.Unary) and x.op == "sqrt")
        or (isinstance(x, ir.Binary) and x.op in ("div", "mod"))
        for x in walk(e)
    )


# ---------------------------------------------------------------- body variants


_FLAG = re.compile(r"^const bool (fastdiv\d+) = ")
_FLAGS = re.compile(r"\b(?:fastdiv|rotok)\d+\b")


def variants(body: Body, lines: list[str]) -> list[dict[str, object]]:
    """The loop body once, or twice when fast-division flags were hoisted or rotated indices
    used: a version with every flag true (straight-line, vectorisable, contiguous reads) under
    their conjunction, and one with every flag false (exact division, checked reads)
    otherwise."""
    flags = [m.group(1) for m in map(_FLAG.match, body.hoist) if m]
    flags += [r.flag for r in body.rotations.values()]
    if not flags:
        return [{"cond": "", "body": lines}]
    return [
        {"cond": " && ".join(flags), "body": [_fix(ln, True, flags) for ln in lines]},
        {"cond": "", "body": [_fix(ln, False, flags) for ln in lines]},
    ]


def _fix(line: str, fast: bool, flags: list[str] | None = None) -> str:
    """``line`` with every fast-division and rotation flag replaced by 1 (``fast``) or 0."""
    return _FLAGS.sub("1" if fast else "0", line)
