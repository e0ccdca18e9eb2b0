"""The C target's ``block(...)`` section (see :mod:`hipress.compll.ir.blocks`): one parallel
loop over the blocks; per block, each map of the section runs over the block's elements into a
thread-private buffer and each segment reduction into a scalar, so the section reads its inputs
and writes its outputs once, whatever it computes in between.

Each map's buffer holds 3B values: the block at ``[B, 2B)``, zeros on either side and past the
tensor's end, so a read at ``i + c`` (``|c| <= B``) of the block's own array is a plain load
that gives the language's 0 outside the block; other indices are checked."""

from __future__ import annotations

from collections.abc import Callable

from hipress.compll.backends.c.butterfly import WIDTHS, Chain, chains, registers, split, widths
from hipress.compll.backends.c.stages import CRenderer
from hipress.compll.backends.cfamily.body import Body
from hipress.compll.backends.cfamily.reduce import reduction
from hipress.compll.backends.cfamily.syntax import ctype
from hipress.compll.ir import nodes as ir
from hipress.compll.ir import ops
from hipress.compll.ir.blocks import rewrite, unmask
from hipress.compll.ir.types import F32
from hipress.compll.ir.walk import lambda_exprs, walk
from hipress.compll.lower.kernel_plan import Special


def _offset(ix: ir.Expr, env: dict[str, str], body: Body, size: int) -> str | None:
    """``ix`` as ``i + c`` (``i`` the loop index, ``|c| <= size``): the C text of ``c``."""
    if isinstance(ix, ir.Ref) and env.get(ix.name) == body.index:
        return "0"
    if not (isinstance(ix, ir.Binary) and ix.op in (ops.ADD.name, ops.SUB.name)):
        return None
    a, c = ix.a, ix.b
    if not (isinstance(a, ir.Ref) and env.get(a.name) == body.index and isinstance(c, ir.Const)):
        return None
    v = int(c.value) * (1 if ix.op == ops.ADD.name else -1)
    return f"({v})" if abs(v) <= size else None


def _reader(f: CRenderer, buf: str, dt: ir.DType, size: int, per_block: bool):
    """The read rule of a section array kept in ``buf`` (a per-block array: a scalar)."""

    def read(x: ir.Load, body: Body, env: dict[str, str]) -> str:
        ix = unmask(x.index)
        if per_block:
            direct = ir.Binary(ops.DIV.name, ix, ir.Const(size, ix.dtype), ix.dtype)
            if ix == direct:  # pragma: no cover - the checker leaves [i / B] unmasked
                return buf
            j = f.em.expr(ix, body, env)
            return f"hp_sel_{dt.name}((int64_t)({j}) == hp_blk, {buf}, ({ctype(dt)})0)"
        off = _offset(ix, env, body, size)
        if off is not None:
            return f"{buf}[hp_off + {body.index} + {off}]"
        j = f.em.expr(ix, body, env)
        v = f.names.fresh("ix")
        body.lines.append(f"const int64_t {v} = (int64_t)({j}) + hp_off;")
        ok = f"(uint64_t){v} < (uint64_t){3 * size}"
        return f"hp_sel_{dt.name}({ok}, {buf}[{ok} ? {v} : 0], ({ctype(dt)})0)"

    return read


def per_block(fn: ir.Lambda, size: int) -> ir.Lambda:
    """``fn`` with ``i / size`` (``i`` its element index) read as the block's index, which is
    the same for every element of the block (one load, not one division and gather each)."""
    i = fn.params[0]
    whole = ir.Binary(ops.DIV.name, i, ir.Const(size, i.dtype), i.dtype)

    def f(x: ir.Expr) -> ir.Expr | None:
        return ir.Ref(BLOCK_REF, i.dtype) if x == whole else None

    return _rewritten(fn, f)


def _rewritten(fn: ir.Lambda, f: Callable[[ir.Expr], ir.Expr | None]) -> ir.Lambda:
    lets = tuple((n, rewrite(v, f)) for n, v in fn.lets)
    return ir.Lambda(fn.params, lets, rewrite(fn.result, f))


def _local_bits(fn: ir.Lambda, size: int) -> tuple[ir.Lambda, dict[str, str]]:
    """``fn`` with each test ``(i & c) == 0`` (or ``!= 0``, ``0 <= c < size``, ``size`` a power
    of two) read from the element's 32-bit index in its block, ``hp_lt``, which has the same
    low bits: a test in 32-bit lanes instead of 64-bit ones. The names bound to C text."""
    i, env = fn.params[0], {}
    if size & (size - 1):
        return fn, env

    def f(x: ir.Expr) -> ir.Expr | None:
        if not (isinstance(x, ir.Binary) and x.op in (ops.EQ.name, ops.NE.name)):
            return None
        m = x.a
        if not (isinstance(m, ir.Binary) and m.op == ops.BAND.name and m.a == i):
            return None
        if not (isinstance(m.b, ir.Const) and 0 <= int(m.b.value) < size):
            return None
        if x.b != ir.Const(0, x.b.dtype):
            return None
        name = f"__hp_bit_{x.op}_{int(m.b.value)}"
        env[name] = f"((hp_lt & {int(m.b.value)}u) {'==' if x.op == ops.EQ.name else '!='} 0u)"
        return ir.Ref(name, x.dtype)

    return _rewritten(fn, f), env


# elements per tile of the C target's inner loops (HP_TILE)
TILE = 2048
BLOCK_REF = "__hp_blk"  # the block's index in a section's lambdas (the C variable hp_blk)


def _body(
    f: CRenderer, fn: ir.Lambda, length: ir.Expr, lv: int, safe: str | None,
    index: str = "i", tile: str | None = None, env: dict[str, str] | None = None,
    aligned: bool = False,
) -> tuple[list[str], str, Body]:  # fmt: skip
    """``fn``'s statements and result at ``index``; ``safe``: the length (repr) that the
    index is known to be below, so reads at it of arrays that long need no check."""
    body = Body(level=lv, index=index, loop_len=length, tile=tile, aligned=aligned)
    if safe is not None:
        body.safe[index] = safe
    v = f.em.apply(fn, [index], body, {BLOCK_REF: "hp_blk", **(env or {})})
    f.hoisted += body.hoist
    return body.lines, v, body


def _stores(f: CRenderer, x: ir.Map, buf: str, v: str, home: bool = True) -> list[str]:
    st = [f"{buf}[hp_off + i] = {v};"] if buf else []
    dest = f.plan.homes.get(x.name) if home else None
    if dest is not None:
        st.append(f.store(dest, f.plan.arrays[x.name].dtype, v))
    return st


def _packed_home(f: CRenderer, x: ir.Map) -> tuple[str, int] | None:
    """(pointer, bits) of the packed payload field ``x`` fills itself
    (:mod:`.blockpack`), else None."""
    home, bits = f.plan.homes.get(x.name), x.type.bits
    if home is None or home.kind != "payload" or bits is None or bits >= 8:
        return None
    return f.target_ptr(home), bits


def pack_lines(buf: str, ptr: str, bits: int) -> list[str]:
    """C packing a tile's ``tl`` values in ``buf`` (``bits`` each) into ``ptr`` from element
    ``i0`` (a whole byte), the last byte's unused bits zero."""
    per = 8 // bits
    expr = " | ".join(f"({buf}[{per} * q + {j}] << {j * bits})" for j in range(per))
    return [
        f"for (int64_t t = tl; t < (tl + {per - 1}) / {per} * {per}; t++) {buf}[t] = 0;",
        "#pragma omp simd",
        f"for (int64_t q = 0; q < (tl + {per - 1}) / {per}; q++) {ptr}[i0 / {per} + q] = (uint8_t)({expr});",
    ]  # fmt: skip


def tiled(size: int) -> bool:
    """Whether a section of blocks of ``size`` runs each map as a tile loop over a block."""
    return size % 8 == 0 and size <= TILE


def _pairs(f: CRenderer, x: ir.Map, fn: ir.Lambda, buf: str, lv: int, safe: str | None) -> str:
    """A whole block of a map choosing on bit ``d`` of its index: a loop over the pairs
    ``(i, i + d)`` computing both branches, with no select (each element's operations are
    those of its branch, in the same order)."""
    got = split(fn, 1 << 30)
    assert got is not None
    d, lo, hi = got
    b1, v1, _ = _body(f, lo, x.type.length, lv, safe)
    b2, v2, _ = _body(f, hi, x.type.length, lv, safe, index="hp_k")
    st = [*_stores(f, x, buf, v1), "{ const int64_t i = hp_k;", *_stores(f, x, buf, v2), "}"]
    return (
        f"      for (int64_t hp_j = hp_b0; hp_j < hp_b1; hp_j += {2 * d}) {{\n"
        f"      #pragma omp simd\n      for (int64_t i = hp_j; i < hp_j + {d}; i++) {{\n"
        f"        const int64_t hp_k = i + {d};\n"
        + "".join(f"        {ln_}\n" for ln_ in [*b1, *b2, *st])
        + "      }\n      }\n"
    )


def _map(f: CRenderer, x: ir.Map, buf: str, size: int, lv: int, safe: str | None) -> str:
    """One map of the section over the block's elements, into its buffer (none, ``""``, where
    no op of the section reads it) and its home."""
    fn = per_block(x.fn, size)
    whole = tiled(size)
    bits, env = _local_bits(fn, size)
    tile = "t" if whole else None
    # a tile is a block at hp_b0 = hp_blk * size: aligned where size is a power of two
    aligned = whole and not size & (size - 1)
    lines, v, body = _body(f, bits, x.type.length, lv, safe, tile=tile, env=env, aligned=aligned)
    if env:
        lt = "(uint32_t)t" if whole else "(uint32_t)(i - hp_b0)"
        lines = [f"const uint32_t hp_lt = {lt};", *lines]
    packed = _packed_home(f, x)
    # (blockpack gives a section a packed home only where this is a tile loop, not pairs)
    assert packed is None or (whole and split(fn, size) is None), x.name
    st = _stores(f, x, buf, v, home=packed is None)
    ln, e = f.length(x.type.length), f.names.fresh("be")
    if whole:
        pre, post = f.tile_pre(body), []
        if packed is not None:  # the field's bytes of this block, from a block of values
            pk, (ptr, bits) = f.names.fresh("pk"), packed
            pre, st = [*pre, f"uint8_t {pk}[{size}];"], [*st, f"{pk}[t] = {v};"]
            post = ["if (tl > 0) {", *pack_lines(pk, ptr, bits), "}"]
        loop = (
            f"      {{ const int64_t i0 = hp_b0; const int32_t tl = (int32_t)({e} - hp_b0);\n"
            + "".join(f"      {p}\n" for p in pre)
            + "      #pragma omp simd\n      for (int32_t t = 0; t < tl; t++) {\n"
            "        const int64_t i = i0 + t;\n"
            + "".join(f"        {ln_}\n" for ln_ in [*lines, *st])
            + "      }\n"
            + "".join(f"      {p}\n" for p in post)
            + "      }\n"
        )
        if pre:
            loop = f"      if ({e} > hp_b0) {{\n{loop}      }}\n"
    else:
        loop = (
            f"      #pragma omp simd\n      for (int64_t i = hp_b0; i < {e}; i++) {{\n"
            + "".join(f"        {ln_}\n" for ln_ in [*lines, *st])
            + "      }\n"
        )
    if split(fn, size) is not None:
        pairs = _pairs(f, x, fn, buf, lv, safe)
        loop = f"      if ({e} == hp_b1) {{\n{pairs}      }} else {{\n{loop}      }}\n"
    return (
        f"      const int64_t {e} = hp_b1 < {ln} ? hp_b1 : {ln};\n"
        + loop
        + (
            f"      for (int64_t i = ({e} > hp_b0 ? {e} : hp_b0) + hp_off; i < {2 * size}; i++) "
            f"{buf}[i] = 0;\n"
            if buf
            else ""
        )
    )


def _segreduce(f: CRenderer, x: ir.SegReduce, sv: str, size: int, lv: int, safe: str | None) -> str:
    """One per-block reduction of the section: scalar ``sv`` (0 past the reduction's end)."""
    body, v, _ = _body(f, per_block(x.fn, size), x.length, lv, safe)
    red = reduction(x.op, v, x.fn.result.dtype, x.dtype, "(hp_b1 - hp_b0)", f.names)
    ln, e = f.length(x.length), f.names.fresh("be")
    decl = "".join(f"      {a.ctype} {a.name} = {a.init};\n" for a in red.accs)
    clauses = "".join(f" reduction({a.clause}:{a.name})" for a in red.accs)
    text = (
        f"      const int64_t {e} = hp_b1 < {ln} ? hp_b1 : {ln};\n"
        + decl
        + f"      #pragma omp simd{clauses}\n"
        f"      for (int64_t i = hp_b0; i < {e}; i++) {{\n"
        + "".join(f"        {ln_}\n" for ln_ in [*body, *red.update])
        + f"      }}\n      const {ctype(x.dtype)} {sv} = hp_b0 < {ln} ? "
        f"({ctype(x.dtype)})({red.final}) : ({ctype(x.dtype)})0;\n"
    )
    home = f.plan.homes.get(x.name)
    if home is not None:
        line = f.store(home, f.plan.arrays[x.name].dtype, sv)
        text += f"      if (hp_b0 < {ln}) {{ const int64_t i = hp_blk; {line} }}\n"
    return text


def _streamed_length(f: CRenderer, op: ir.Block) -> ir.Expr | None:
    """The length of the arrays from outside the section that its ops read most at ``[i]``
    (the gradient, state): blocks that end within it read them unchecked."""
    seen: dict[str, tuple[int, ir.Expr]] = {}
    for x in op.ops:
        p = x.fn.params[0].name
        for e in lambda_exprs(x.fn):
            for ld in walk(e):
                if not isinstance(ld, ir.Load) or ld.array in f.em.local:
                    continue
                if isinstance(ld.index, ir.Ref) and ld.index.name == p:
                    ln = f.plan.arrays[ld.array].length
                    k, _ = seen.get(repr(ln), (0, ln))
                    seen[repr(ln)] = (k + 1, ln)
    return max(seen.values(), key=lambda t: t[0])[1] if seen else None


def _chain(
    f: CRenderer, op: ir.Block, ch: Chain, vars_: list[str], lv: int, safe: str | None
) -> str:
    """Butterfly chain ``ch`` (:mod:`.butterfly`): on whole blocks in registers where the CPU
    has the SIMD width, else (and on a partial block) stage by stage."""
    size, stages = op.size, op.ops[ch.first : ch.last + 1]
    loops = "".join(_map(f, x, vars_[ch.first + k], size, lv, safe) for k, x in enumerate(stages))
    last = stages[-1]
    assert isinstance(last, ir.Map)
    src, dst, home = vars_[ch.src], vars_[ch.last], f.plan.homes.get(last.name)
    keep = []
    if home is not None:
        line = f.store(home, F32, f"{dst}[hp_off + i]")
        keep = [
            "      #pragma omp simd",
            f"      for (int64_t i = hp_b0; i < hp_b1; i++) {{ {line} }}",
        ]
    text, e = "", f.names.fresh("be")
    for k, w in enumerate(widths(size)):
        regs = registers(w, size, ch.ds, f"{src} + {size}", f"{dst} + {size}")
        text += f"#{'el' if k else ''}if {WIDTHS[w][0]}\n      {{\n"
        text += (
            "".join(f"        {r}\n" for r in regs) + "      }\n" + "".join(f"{x}\n" for x in keep)
        )
    ln = f.length(last.type.length)
    return (
        f"      const int64_t {e} = hp_b1 < {ln} ? hp_b1 : {ln};\n"
        f"      if ({e} == hp_b1) {{\n{text}#else\n{loops}#endif\n      }} else {{\n{loops}      }}\n"
    )


def _parts(f: CRenderer, op: ir.Block, vars_: list[str], lv: int, safe: str | None) -> str:
    found = chains(op, [bool(v) for v in vars_], set(f.plan.homes)) if widths(op.size) else {}
    out, skip = [], -1
    for k, (x, var) in enumerate(zip(op.ops, vars_, strict=True)):
        if k <= skip:
            continue
        if k in found:
            out.append(_chain(f, op, found[k], vars_, lv, safe))
            skip = found[k].last
        elif isinstance(x, ir.Map):
            out.append(_map(f, x, var, op.size, lv, safe))
        else:
            assert isinstance(x, ir.SegReduce)
            out.append(_segreduce(f, x, var, op.size, lv, safe))
    return "".join(out)


def render_block(f: CRenderer, sp: Special) -> str:
    """The section ``sp``: a parallel loop over blocks of the longest of its ops; the blocks
    that end within the arrays it streams run a version without their bounds checks."""
    op = sp.op
    assert isinstance(op, ir.Block)
    size, lv = op.size, sp.level
    setup: list[str] = []
    vars_: list[str] = []
    lengths = []
    read = {ld.array for y in op.ops for e in lambda_exprs(y.fn) for ld in walk(e)
            if isinstance(ld, ir.Load)}  # fmt: skip
    for x in op.ops:
        if isinstance(x, ir.Map) and x.name not in read:  # stored to its home alone
            vars_.append("")
            lengths.append(f.length(x.type.length))
            continue
        if isinstance(x, ir.Map):
            dt = x.type.dtype
            scr = f.scratch(ctype(dt), f"(int64_t)nt * {3 * size}")
            var = f.names.fresh("blk")
            setup.append(f"{ctype(dt)}* const {var} = {scr} + (int64_t)hp_t * {3 * size};")
            setup.append(f"memset({var}, 0, sizeof({ctype(dt)}) * {3 * size});")
            lengths.append(f.length(x.type.length))
        else:
            assert isinstance(x, ir.SegReduce)
            dt, var = x.dtype, f.names.fresh("bs")
            lengths.append(f.length(x.length))
        vars_.append(var)
        f.em.local[x.name] = _reader(f, var, dt, size, isinstance(x, ir.SegReduce))
    streamed = _streamed_length(f, op)
    body = _parts(f, op, vars_, lv, None)
    if streamed is not None:
        fast = _parts(f, op, vars_, lv, repr(streamed))
        body = (
            f"      if (hp_b1 <= {f.length(streamed)}) {{\n{fast}      }} else {{\n{body}      }}\n"
        )
    for x in op.ops:
        f.em.local.pop(x.name, None)
    longest = "".join(f" if ({ln} > hp_bl) hp_bl = {ln};" for ln in dict.fromkeys(lengths))
    return (
        f"  {{ /* level {lv}: block({size}) section of {len(op.ops)} ops */\n"
        f"    int64_t hp_bl = 0;{longest}\n"
        f"    const int64_t hp_bn = (hp_bl + {size - 1}) / {size};\n"
        f"    #pragma omp parallel num_threads(nt) if(hp_bl >= HP_PAR_MIN)\n    {{\n"
        f"      const int hp_t = omp_get_thread_num();\n"
        + "".join(f"      {s}\n" for s in setup)
        + "      #pragma omp for schedule(static)\n"
        f"      for (int64_t hp_blk = 0; hp_blk < hp_bn; hp_blk++) {{\n"
        f"      const int64_t hp_b0 = hp_blk * {size}, hp_off = {size} - hp_b0;\n"
        f"      const int64_t hp_b1 = hp_b0 + {size};\n" + body + "      }\n    }\n  }"
    )
