"""The C target's stages of their own (filter, top-k, sort, scan, segment reduction, scatter,
custom reduction): one rule per stage kind (:data:`STAGES`), each a function of the
:class:`~hipress.compll.backends.c.render.CFunction` rendering it and the stage."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Protocol, TypeVar

from hipress.compll.backends.c import matmul
from hipress.compll.backends.cfamily.body import Body, fix, variants
from hipress.compll.backends.cfamily.protocol import FamilyRenderer
from hipress.compll.backends.cfamily.reduce import minmax_identity, reduction
from hipress.compll.backends.cfamily.syntax import const, ctype, mtype, scatter_combine
from hipress.compll.ir import nodes as ir
from hipress.compll.ir import ops
from hipress.compll.ir.types import F32, I64
from hipress.compll.lower.kernel_plan import FilterFusion, Loop, ScatterAdd, Special


class CRenderer(FamilyRenderer, Protocol):
    """What the rules use of the :class:`~hipress.compll.backends.c.render.CFunction` calling
    them, besides what every C-family function has."""

    def loop(self, lp: Loop) -> str: ...

    def special(self, sp: Special) -> str: ...

    def guard(self, fn: ir.Lambda, level: int) -> str | None: ...

    def tile_pre(self, body: Body) -> list[str]: ...


S = TypeVar("S")
StageRule = Callable[[CRenderer, Special], str]


def _start(f: CRenderer, sp: Special, kind: type[S]) -> tuple[S, int, str]:
    """The stage's op (of type ``kind``), level and output pointer ("" where it has none)."""
    home = f.target_ptr(sp.home) if sp.home is not None else ""
    if not isinstance(sp.op, kind):  # pragma: no cover - STAGES dispatches on the type
        raise TypeError(f"not a {kind.__name__}: {sp.op!r}")
    return sp.op, sp.level, home


def _renderer(f: CRenderer, lv: int) -> Callable[..., str]:
    """Renders a stage template at level ``lv``."""

    def r(tpl: str, /, **kw: object) -> str:
        return f.env.get_template(tpl).render(level=lv, **kw)

    return r


def _filter(f: CRenderer, sp: Special) -> str:
    """The filter's pass; with ``ff``, the maps deferred to it are stored by their own loop
    before it, or (without a guard, and where a rotation covers every index once) by the
    filter's pass itself, which then scans the whole length even once the bound is
    reached."""
    op, lv, home = _start(f, sp, ir.Filter)
    r = _renderer(f, lv)
    ff = next((x for x in f.plan.filter_fusions if x.special is sp), None)
    ln, bl = f.length(op.length), f.length(op.bound)
    cnt = f.names.get(op.count)
    scratch = f.scratch("int32_t", f"hp_min_i64({ln}, (int64_t)nt * {bl})")
    text = _filter_pass(f, op, lv, home, ln, bl, cnt, scratch, None, r)
    guard = f.guard(op.pred, lv)
    if guard is not None:  # nothing passes: no pass
        text = (
            f"  if ({guard}) {{\n{text}\n  }} else {{\n    {cnt} = 0;\n"
            f"    memset({home}, 0, (size_t){bl} * 4);\n  }}"
        )
    nf, decl, scan = _nonfinite(f, ff.special) if ff is not None else ("", "", "")
    if ff is not None:
        text = f.loop(ff.loop) + "\n" + scan + text
        if guard is None:
            fused = _filter_pass(f, op, lv, home, ln, bl, cnt, scratch, ff, r, nf)
            if ff.offset is None:
                text = fused
            else:
                host = Body(level=lv)
                h = f.em.expr(ff.offset, host, {})
                assert not host.lines  # a host expression (defer.filter_index)
                text = (
                    f"  if (({h}) >= 0 && ({h}) < {ln}) {{ /* every index once */\n"
                    f"{fused}\n  }} else {{\n{text}\n  }}"
                )
    return f"  int64_t {cnt};\n" + decl + text


def _filter_pass(
    f: CRenderer, op: ir.Filter, lv: int, home: str, ln: str, bl: str, cnt: str, scratch: str,
    ff: FilterFusion | None, r: Callable[..., str], nf: str = "",
) -> str:  # fmt: skip
    names = frozenset(it.op.name for it in ff.loop.items) if ff is not None else frozenset()
    fb = Body(level=lv, index="j", loop_len=op.length, tile="t", recompute=names)
    stores = _deferred_stores(f, ff, fb) if ff is not None else []
    res = f.em.apply(op.pred, ["j"], fb)
    f.hoisted += fb.hoist
    vs = [
        {**v, "result": fix(res, fast), "stores": [fix(x, fast) for x in stores]}
        for v, fast in zip(variants(fb, fb.lines), (True, False), strict=False)
    ]
    return r(
        "c_filter.c.j2", idx_name=op.idx, length=ln, bound=bl, idx=home, scratch=scratch,
        variants=vs, count=cnt, pre=f.tile_pre(fb), full=ff is not None,
        also=", ".join(sorted(names)), nf=nf,
    )  # fmt: skip


def _deferred_stores(f: CRenderer, ff: FilterFusion, body: Body) -> list[str]:
    """The maps deferred to a stage, computed in ``body`` (which recomputes them) at the
    stage's index, and the lines that store them there (after everything else the
    iteration reads); where the stage computes the gradient's NaN/Inf flag, the line that
    ORs it into the thread's ``qnf``."""
    env = {ff.param: "j"}
    at = f.em.expr(ff.index, body, env)
    stores = []
    if f.plan.nonfinite_stage is ff.special:
        g = f.em.load(ir.Load(f.prog.encode.grad, ff.index, F32), body, env)
        stores.append(f"qnf |= !(fabsf({g}) < HP_INF_F);")
    for it in ff.loop.items:
        assert isinstance(it.op, ir.Map)
        dt = it.op.type.dtype
        v = f.em.load(ir.Load(it.op.name, ff.index, dt), body, env)
        for tg in it.targets:
            val = f"(uint8_t)({v})" if dt.is_bool else v
            stores.append(f"{f.target_ptr(tg)}[{at}] = {val};")
    return stores


def _nonfinite(f: CRenderer, sp: Special) -> tuple[str, str, str]:
    """Where ``sp``'s fused pass computes the gradient's NaN/Inf flag: its C variable, its
    declaration (function scope, before the stage) and the separate pass that computes it
    where the stage takes its path without the fused pass; else three empty strings."""
    if f.plan.nonfinite_stage is not sp or f.plan.nonfinite is None:
        return "", "", ""
    nf = f.names.get(f.plan.nonfinite)
    n = f.length(ir.Ref(ir.N, I64))
    scan = (
        "  { /* the gradient's NaN/Inf flag, where the fused pass did not run */\n"
        "    int q = 0;\n"
        f"    #pragma omp parallel for num_threads(nt) reduction(|:q) if({n} >= HP_PAR_MIN)\n"
        f"    for (int64_t j = 0; j < {n}; j++) q |= !(fabsf(s_grad[j]) < HP_INF_F);\n"
        f"    {nf} = q != 0;\n  }}\n"
    )
    return nf, f"  bool {nf} = false;\n", scan


def _topk(f: CRenderer, sp: Special) -> str:
    op, lv, home = _start(f, sp, ir.TopK)
    r = _renderer(f, lv)
    kb = Body(level=lv, index="j", loop_len=op.length, tile="t")
    res = f.em.apply(op.key, ["j"], kb)
    f.hoisted += kb.hoist
    # the maps deferred to it: computed and stored by its first pass over the keys
    # (later passes read them), or by their own loop where it makes no pass
    ff = next((f for f in f.plan.filter_fusions if f.special is sp), None)
    first = kb
    fres, stores, fallback = res, [], ""
    nf, decl, scan = _nonfinite(f, sp)
    if ff is not None:
        names = frozenset(it.op.name for it in ff.loop.items)
        first = Body(level=lv, index="j", loop_len=op.length, tile="t", recompute=names)
        stores = _deferred_stores(f, ff, first)
        fres = f.em.apply(op.key, ["j"], first)
        f.hoisted += first.hoist
        fallback = f.loop(ff.loop) + "\n" + scan
    ln = f.length(op.length)
    kdt = op.key.result.dtype
    ku = "uint64_t" if kdt.bits == 64 else "uint32_t"
    cnt = f.names.get(op.count)
    kk = f.length(op.k)
    take = f"hp_min_i64({kk}, {ln})"
    # candidates per thread: at least what is taken, so ties beyond it need no room
    cap = f"hp_min_i64({ln}, 4 * {take} + 8192)"
    return f"  int64_t {cnt};\n" + decl + r(
        "c_topk.c.j2", nf=nf, idx_name=op.idx, length=ln, k=kk, idx=home, ku=ku, kt=kdt.name,
        kbits=64 if kdt.bits == 64 else 32, cap=cap,
        scratch_sure=f.scratch("int32_t", f"(int64_t)nt * {take}"),
        scratch_cidx=f.scratch("int32_t", f"(int64_t)nt * {cap}"),
        scratch_ckey=f.scratch(ku, f"(int64_t)nt * {cap}"),
        pre_lines=f.tile_pre(kb), body=kb.lines, result=res, count=cnt,
        first_pre=f.tile_pre(first), first_body=first.lines, first_result=fres,
        first_stores=stores, fallback=fallback,
    )  # fmt: skip


def _sort(f: CRenderer, sp: Special) -> str:
    op, lv, home = _start(f, sp, ir.Sort)
    r = _renderer(f, lv)
    body, res = f.lambda_body(op.key, op.length, lv)
    ln = f.length(op.length)
    ku = "uint64_t" if op.dtype.bits == 64 else "uint32_t"
    return r(
        "c_sort.c.j2", out_name=op.name, length=ln, out=home, vt=ctype(op.dtype), ku=ku,
        kt=op.dtype.name, kbits=64 if op.dtype.bits == 64 else 32,
        is_float=op.dtype.is_float, scratch_a=f.scratch(ku, ln),
        scratch_b=f.scratch(ku, ln), scratch_h=f.scratch("int64_t", "HP_MAXT * 256"),
        body=body, result=res,
    )  # fmt: skip


def _scan(f: CRenderer, sp: Special) -> str:
    op, lv, home = _start(f, sp, ir.Scan)
    r = _renderer(f, lv)
    body, res = f.lambda_body(op.fn, op.length, lv)
    dt = op.dtype
    seq = op.op == ops.REDUCE_SUM.name and dt.is_float
    if op.op == ops.REDUCE_SUM.name:
        ident = const(0, dt)
        comb = lambda a, b: f"hp_add_{dt.name}({a}, {b})"  # noqa: E731
    else:
        ident = minmax_identity(op.op, dt)
        comb = lambda a, b: f"hp_{op.op}_{dt.name}({a}, {b})"  # noqa: E731
    return r(
        "c_scan.c.j2", op=op.op, out_name=op.name, length=f.length(op.length), out=home,
        vt=ctype(dt), sequential=seq, identity=ident, combine=comb, body=body, result=res,
    )  # fmt: skip


def _segreduce(f: CRenderer, sp: Special) -> str:
    op, lv, home = _start(f, sp, ir.SegReduce)
    r = _renderer(f, lv)
    body, res = f.lambda_body(op.fn, op.length, lv)
    dt = op.fn.result.dtype
    red = reduction(op.op, res, dt, op.dtype, "(j1 - j0)", f.names)
    final = red.final
    out_len = f.length(f.plan.arrays[op.name].length)
    generic = r(
        "c_segreduce.c.j2", op=op.op, out_name=op.name, length=f.length(op.length),
        seg=f.length(op.seg), out_len=out_len, out=home, vt=mtype(op.dtype),
        acc_decls=[f"{a.ctype} {a.name} = {a.init};" for a in red.accs],
        clauses="".join(f" reduction({a.clause}:{a.name})" for a in red.accs),
        body=body, update=list(red.update), final=final, short=_short_segment(op.seg),
    )  # fmt: skip
    return matmul.render(f, op, lv, home, generic) if op.matmul is not None else generic


SHORT_SEGMENT = 16  # constant segments up to this long reduce one per SIMD lane


def _short_segment(seg: ir.Expr) -> int:
    """The length of a constant segment short enough to reduce one per SIMD lane (a SIMD
    reduction per segment costs more than its few elements), else 0."""
    if isinstance(seg, ir.Const) and 1 <= int(seg.value) <= SHORT_SEGMENT:
        return int(seg.value)
    return 0


def _scatter(f: CRenderer, sp: Special) -> str:
    add_op, lv, home = _start(f, sp, ScatterAdd)
    op = add_op.op
    r = _renderer(f, lv)
    idx_a = f.plan.arrays[op.idx]
    body = Body(level=lv, index="j", loop_len=idx_a.length)
    index = f.em.load(ir.Load(op.idx, ir.Ref("__j", idx_a.dtype), idx_a.dtype), body, {"__j": "j"})
    val = f.em.load(ir.Load(op.vals, ir.Ref("__j", op.dtype), op.dtype), body, {"__j": "j"})
    f.hoisted += body.hoist
    dt = op.dtype
    add = scatter_combine(op.mode, dt)
    body_count = Body(level=lv)
    count = f.em.expr(op.count, body_count, {})
    pre = "".join(f"  {ln}\n" for ln in body_count.lines)
    return pre + r(
        "c_scatter.c.j2", out_name=op.name, length=f.length(op.length), count=count,
        idx_len=f.length(idx_a.length), out=home, vt=mtype(dt), body=body.lines,
        index=index, value=val, add=add, mode=op.mode,
    )  # fmt: skip


def _custom(f: CRenderer, sp: Special) -> str:
    op, lv, _ = _start(f, sp, ir.Reduce)
    return f.custom_reduce(op, lv, lv)


STAGES: Mapping[type, StageRule] = MappingProxyType({
    ir.Filter: _filter,
    ir.TopK: _topk,
    ir.Sort: _sort,
    ir.Scan: _scan,
    ir.SegReduce: _segreduce,
    ScatterAdd: _scatter,
    ir.Reduce: _custom,
})  # fmt: skip
