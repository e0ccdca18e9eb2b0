"""The C target's ``block(...)`` section (see :mod:`hipress.compll.ir.blocks`): one parallel
loop over the blocks; per block, each map of the section runs over the block's elements into a
thread-private buffer and each segment reduction into a scalar, so the section reads its inputs
and writes its outputs once, whatever it computes in between.

Each map's buffer holds 3B values: the block at ``[B, 2B)``, zeros on either side and past the
tensor's end, so a read at ``i + c`` (``|c| <= B``) of the block's own array is a plain load
that gives the language's 0 outside the block; other indices are checked."""

from __future__ import annotations

from hipress.compll.backends.c.stages import CRenderer
from hipress.compll.backends.cfamily.body import Body
from hipress.compll.backends.cfamily.reduce import reduction
from hipress.compll.backends.cfamily.syntax import ctype
from hipress.compll.ir import nodes as ir
from hipress.compll.ir import ops
from hipress.compll.ir.blocks import unmask
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


def render_block(f: CRenderer, sp: Special) -> str:
    op = sp.op
    assert isinstance(op, ir.Block)
    size, lv = op.size, sp.level
    plan = f.plan
    ln = f.length(op.length)
    setup: list[str] = []
    parts: list[str] = []
    for x in op.ops:
        a = plan.arrays[x.name]
        dt = x.type.dtype if isinstance(x, ir.Map) else x.dtype
        home = plan.homes.get(x.name)
        if isinstance(x, ir.Map):
            scr = f.scratch(ctype(dt), f"(int64_t)nt * {3 * size}")
            buf = f.names.fresh("blk")
            setup.append(f"{ctype(dt)}* const {buf} = {scr} + (int64_t)hp_t * {3 * size};")
            setup.append(f"memset({buf}, 0, sizeof({ctype(dt)}) * {3 * size});")
            body, v = f.lambda_body(x.fn, op.length, lv, idx="i")
            st = [f"{buf}[hp_off + i] = {v};"]
            if home is not None:
                st.append(f.store(home, a.dtype, v))
            parts.append(
                "      #pragma omp simd\n      for (int64_t i = hp_b0; i < hp_b1; i++) {\n"
                + "".join(f"        {ln_}\n" for ln_ in [*body, *st])
                + "      }\n"
                + f"      for (int64_t i = hp_b1 + hp_off; i < {2 * size}; i++) {buf}[i] = 0;\n"
            )
            f.em.local[x.name] = _reader(f, buf, dt, size, False)
        else:
            assert isinstance(x, ir.SegReduce)
            body, v = f.lambda_body(x.fn, op.length, lv, idx="i")
            red = reduction(x.op, v, x.fn.result.dtype, x.dtype, "(hp_b1 - hp_b0)", f.names)
            sv = f.names.fresh("bs")
            decl = "".join(f"      {a_.ctype} {a_.name} = {a_.init};\n" for a_ in red.accs)
            clauses = "".join(f" reduction({a_.clause}:{a_.name})" for a_ in red.accs)
            parts.append(
                decl + f"      #pragma omp simd{clauses}\n"
                f"      for (int64_t i = hp_b0; i < hp_b1; i++) {{\n"
                + "".join(f"        {ln_}\n" for ln_ in [*body, *red.update])
                + f"      }}\n      const {ctype(x.dtype)} {sv} = {red.final};\n"
            )
            if home is not None:
                parts.append(
                    f"      {{ const int64_t i = hp_blk; {f.store(home, a.dtype, sv)} }}\n"
                )
            f.em.local[x.name] = _reader(f, sv, x.dtype, size, True)
    for x in op.ops:
        f.em.local.pop(x.name, None)
    return (
        f"  {{ /* level {lv}: block({size}) section of {len(op.ops)} ops */\n"
        f"    const int64_t hp_bl = {ln}, hp_bn = (hp_bl + {size - 1}) / {size};\n"
        f"    #pragma omp parallel num_threads(nt) if(hp_bl >= HP_PAR_MIN)\n    {{\n"
        f"      const int hp_t = omp_get_thread_num();\n"
        + "".join(f"      {s}\n" for s in setup)
        + "      #pragma omp for schedule(static)\n"
        f"      for (int64_t hp_blk = 0; hp_blk < hp_bn; hp_blk++) {{\n"
        f"      const int64_t hp_b0 = hp_blk * {size}, hp_off = {size} - hp_b0;\n"
        f"      const int64_t hp_b1 = hp_b0 + {size} < hp_bl ? hp_b0 + {size} : hp_bl;\n"
        + "".join(parts)
        + "      }\n    }\n  }"
    )
