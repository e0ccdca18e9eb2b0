"""The C target's stages of their own (filter, topk, sort, scan, segment reduction, scatter, custom
reduction): a part of :class:`~hipress.compll.render_c.CFunction`, which mixes this in."""

from __future__ import annotations

from collections.abc import Callable

from hipress.compll import ir
from hipress.compll.plan import FilterFusion, ScatterAdd, Special
from hipress.compll.render_expr import Body, _fix, const, ctype, mtype, variants
from hipress.compll.render_reduce import _ident_minmax, reduction
from hipress.compll.types import F32, I64


class Stages:
    """Rendering of the special stages; mixed into :class:`~hipress.compll.render_c.CFunction`,
    whose state (names, lengths, the plan, the emitter, the workspace) it uses."""

    def _lambda(
        self, fn: ir.Lambda, length: ir.Expr | None, level: int, idx: str = "j"
    ) -> tuple[list[str], str]:
        body = Body(level=level, index=idx, loop_len=length)
        v = self.em.apply(fn, [idx], body)
        self.hoisted += body.hoist
        return body.lines, v

    def special(self, sp: Special) -> str:
        self.hoisted = []
        text = self._special(sp)
        return "".join(f"  {ln}\n" for ln in self.hoisted) + text

    def _special(self, sp: Special) -> str:
        op = sp.op
        lv = sp.level
        home = self.target_ptr(sp.home) if sp.home is not None else None

        def r(tpl, /, **kw) -> str:
            return self.env.get_template(tpl).render(level=lv, **kw)

        if isinstance(op, ir.Filter):
            assert home is not None
            ff = next((f for f in self.plan.filter_fusions if f.special is sp), None)
            return self._filter(op, lv, home, ff, r)
        if isinstance(op, ir.TopK):
            kb = Body(level=lv, index="j", loop_len=op.length, tile="t")
            res = self.em.apply(op.key, ["j"], kb)
            self.hoisted += kb.hoist
            # the maps deferred to it: computed and stored by its first pass over the keys
            # (later passes read them), or by their own loop where it makes no pass
            ff = next((f for f in self.plan.filter_fusions if f.special is sp), None)
            first = kb
            fres, stores, fallback = res, [], ""
            nf, decl, scan = self._nonfinite(sp)
            if ff is not None:
                names = frozenset(it.op.name for it in ff.loop.items)
                first = Body(level=lv, index="j", loop_len=op.length, tile="t", recompute=names)
                stores = self._deferred_stores(ff, first)
                fres = self.em.apply(op.key, ["j"], first)
                self.hoisted += first.hoist
                fallback = self.loop(ff.loop) + "\n" + scan
            ln = self.length(op.length)
            kdt = op.key.result.dtype
            ku = "uint64_t" if kdt.bits == 64 else "uint32_t"
            cnt = self.names.get(op.count)
            kk = self.length(op.k)
            take = f"hp_min_i64({kk}, {ln})"
            # candidates per thread: at least what is taken, so ties beyond it need no room
            cap = f"hp_min_i64({ln}, 4 * {take} + 8192)"
            return f"  int64_t {cnt};\n" + decl + r(
                "c_topk.c.j2", nf=nf, idx_name=op.idx, length=ln, k=kk, idx=home, ku=ku, kt=kdt.name,
                kbits=64 if kdt.bits == 64 else 32, cap=cap,
                scratch_sure=self.scratch("int32_t", f"(int64_t)nt * {take}"),
                scratch_cidx=self.scratch("int32_t", f"(int64_t)nt * {cap}"),
                scratch_ckey=self.scratch(ku, f"(int64_t)nt * {cap}"),
                pre_lines=self._tile_pre(kb), body=kb.lines, result=res, count=cnt,
                first_pre=self._tile_pre(first), first_body=first.lines, first_result=fres,
                first_stores=stores, fallback=fallback,
            )  # fmt: skip
        if isinstance(op, ir.Sort):
            body, res = self._lambda(op.key, op.length, lv)
            ln = self.length(op.length)
            ku = "uint64_t" if op.dtype.bits == 64 else "uint32_t"
            return r(
                "c_sort.c.j2", out_name=op.name, length=ln, out=home, vt=ctype(op.dtype), ku=ku,
                kt=op.dtype.name, kbits=64 if op.dtype.bits == 64 else 32,
                is_float=op.dtype.is_float, scratch_a=self.scratch(ku, ln),
                scratch_b=self.scratch(ku, ln), scratch_h=self.scratch("int64_t", "HP_MAXT * 256"),
                body=body, result=res,
            )  # fmt: skip
        if isinstance(op, ir.Scan):
            return self._scan(op, lv, home, r)
        if isinstance(op, ir.SegReduce):
            return self._segreduce(op, lv, home, r)
        if isinstance(op, ScatterAdd):
            return self._scatter(op.op, lv, home, r)
        assert isinstance(op, ir.Reduce)
        return self._custom(op, lv, r)

    def _filter(
        self, op: ir.Filter, lv: int, home: str, ff: FilterFusion | None, r: Callable[..., str]
    ) -> str:
        """The filter's pass; with ``ff``, the maps deferred to it are stored by their own loop
        before it, or (without a guard, and where a rotation covers every index once) by the
        filter's pass itself, which then scans the whole length even once the bound is
        reached."""
        ln, bl = self.length(op.length), self.length(op.bound)
        cnt = self.names.get(op.count)
        scratch = self.scratch("int32_t", f"hp_min_i64({ln}, (int64_t)nt * {bl})")
        text = self._filter_pass(op, lv, home, ln, bl, cnt, scratch, None, r)
        guard = self._guard(op.pred, lv)
        if guard is not None:  # nothing passes: no pass
            text = (
                f"  if ({guard}) {{\n{text}\n  }} else {{\n    {cnt} = 0;\n"
                f"    memset({home}, 0, (size_t){bl} * 4);\n  }}"
            )
        nf, decl, scan = self._nonfinite(ff.special) if ff is not None else ("", "", "")
        if ff is not None:
            text = self.loop(ff.loop) + "\n" + scan + text
            if guard is None:
                fused = self._filter_pass(op, lv, home, ln, bl, cnt, scratch, ff, r, nf)
                if ff.offset is None:
                    text = fused
                else:
                    host = Body(level=lv)
                    h = self.em.expr(ff.offset, host, {})
                    assert not host.lines  # a host expression (lower._filter_index)
                    text = (
                        f"  if (({h}) >= 0 && ({h}) < {ln}) {{ /* every index once */\n"
                        f"{fused}\n  }} else {{\n{text}\n  }}"
                    )
        return f"  int64_t {cnt};\n" + decl + text

    def _filter_pass(
        self, op: ir.Filter, lv: int, home: str, ln: str, bl: str, cnt: str, scratch: str,
        ff: FilterFusion | None, r: Callable[..., str], nf: str = "",
    ) -> str:  # fmt: skip
        names = frozenset(it.op.name for it in ff.loop.items) if ff is not None else frozenset()
        fb = Body(level=lv, index="j", loop_len=op.length, tile="t", recompute=names)
        stores = self._deferred_stores(ff, fb) if ff is not None else []
        res = self.em.apply(op.pred, ["j"], fb)
        self.hoisted += fb.hoist
        vs = [
            {**v, "result": _fix(res, fast), "stores": [_fix(x, fast) for x in stores]}
            for v, fast in zip(variants(fb, fb.lines), (True, False), strict=False)
        ]
        return r(
            "c_filter.c.j2", idx_name=op.idx, length=ln, bound=bl, idx=home, scratch=scratch,
            variants=vs, count=cnt, pre=self._tile_pre(fb), full=ff is not None,
            also=", ".join(sorted(names)), nf=nf,
        )  # fmt: skip

    def _deferred_stores(self, ff: FilterFusion, body: Body) -> list[str]:
        """The maps deferred to a stage, computed in ``body`` (which recomputes them) at the
        stage's index, and the lines that store them there (after everything else the
        iteration reads); where the stage computes the gradient's NaN/Inf flag, the line that
        ORs it into the thread's ``qnf``."""
        env = {ff.param: "j"}
        at = self.em.expr(ff.index, body, env)
        stores = []
        if self.plan.nonfinite_stage is ff.special:
            g = self.em.load(ir.Load(self.prog.encode.grad, ff.index, F32), body, env)
            stores.append(f"qnf |= !(fabsf({g}) < HP_INF_F);")
        for it in ff.loop.items:
            assert isinstance(it.op, ir.Map)
            dt = it.op.type.dtype
            v = self.em.load(ir.Load(it.op.name, ff.index, dt), body, env)
            for tg in it.targets:
                val = f"(uint8_t)({v})" if dt.is_bool else v
                stores.append(f"{self.target_ptr(tg)}[{at}] = {val};")
        return stores

    def _nonfinite(self, sp: Special) -> tuple[str, str, str]:
        """Where ``sp``'s fused pass computes the gradient's NaN/Inf flag: its C variable, its
        declaration (function scope, before the stage) and the separate pass that computes it
        where the stage takes its path without the fused pass; else three empty strings."""
        if self.plan.nonfinite_stage is not sp or self.plan.nonfinite is None:
            return "", "", ""
        nf = self.names.get(self.plan.nonfinite)
        n = self.length(ir.Ref(ir.N, I64))
        scan = (
            "  { /* the gradient's NaN/Inf flag, where the fused pass did not run */\n"
            "    int q = 0;\n"
            f"    #pragma omp parallel for num_threads(nt) reduction(|:q) if({n} >= HP_PAR_MIN)\n"
            f"    for (int64_t j = 0; j < {n}; j++) q |= !(fabsf(s_grad[j]) < HP_INF_F);\n"
            f"    {nf} = q != 0;\n  }}\n"
        )
        return nf, f"  bool {nf} = false;\n", scan

    def _scan(self, op: ir.Scan, lv: int, home: str | None, r: Callable[..., str]) -> str:
        body, res = self._lambda(op.fn, op.length, lv)
        dt = op.dtype
        seq = op.op == "sum" and dt.is_float
        if op.op == "sum":
            ident = const(0, dt)
            comb = lambda a, b: f"hp_add_{dt.name}({a}, {b})"  # noqa: E731
        else:
            ident = _ident_minmax(op.op, dt)
            comb = lambda a, b: f"hp_{op.op}_{dt.name}({a}, {b})"  # noqa: E731
        return r(
            "c_scan.c.j2", op=op.op, out_name=op.name, length=self.length(op.length), out=home,
            vt=ctype(dt), sequential=seq, identity=ident, combine=comb, body=body, result=res,
        )  # fmt: skip

    def _segreduce(self, op: ir.SegReduce, lv: int, home: str | None, r: Callable[..., str]) -> str:
        body, res = self._lambda(op.fn, op.length, lv)
        dt = op.fn.result.dtype
        red = reduction(op.op, res, dt, op.dtype, "(j1 - j0)", self.names)
        final = red.final
        out_len = self.length(self.plan.arrays[op.name].length)
        return r(
            "c_segreduce.c.j2", op=op.op, out_name=op.name, length=self.length(op.length),
            seg=self.length(op.seg), out_len=out_len, out=home, vt=mtype(op.dtype),
            acc_decls=[f"{a.ctype} {a.name} = {a.init};" for a in red.accs],
            clauses="".join(f" reduction({a.clause}:{a.name})" for a in red.accs),
            body=body, update=list(red.update), final=final,
        )  # fmt: skip

    def _scatter(self, op: ir.Scatter, lv: int, home: str | None, r: Callable[..., str]) -> str:
        idx_a = self.plan.arrays[op.idx]
        body = Body(level=lv, index="j", loop_len=idx_a.length)
        index = self.em.load(
            ir.Load(op.idx, ir.Ref("__j", idx_a.dtype), idx_a.dtype), body, {"__j": "j"}
        )
        val = self.em.load(ir.Load(op.vals, ir.Ref("__j", op.dtype), op.dtype), body, {"__j": "j"})
        self.hoisted += body.hoist
        dt = op.dtype
        add = (
            (lambda a, b: f"({a} + {b})")
            if dt.is_float
            else (lambda a, b: f"hp_add_{dt.name}({a}, {b})")
        )
        body_count = Body(level=lv)
        count = self.em.expr(op.count, body_count, {})
        pre = "".join(f"  {ln}\n" for ln in body_count.lines)
        return pre + r(
            "c_scatter.c.j2", out_name=op.name, length=self.length(op.length), count=count,
            idx_len=self.length(idx_a.length), out=home, vt=mtype(dt), body=body.lines,
            index=index, value=val, add=add,
        )  # fmt: skip

    def _custom(self, op: ir.Reduce, lv: int, r: Callable[..., str]) -> str:
        assert op.combine is not None and op.init is not None
        body, res = self._lambda(op.fn, op.length, lv)
        ib = Body(level=lv)
        init = self.em.expr(op.init, ib, {})
        cb = Body(level=lv)
        cres = self.em.apply(op.combine, ["ca", "cb"], cb)
        dt = op.dtype
        ln = self.length(op.length)
        var = self.names.get(op.name)
        return f"  {ctype(dt)} {var};\n" + r(
            "c_custom_reduce.c.j2", name=var, length=ln, vt=ctype(dt),
            scratch_a=self.scratch(ctype(dt), ln, (op.length, 8)),
            scratch_b=self.scratch(ctype(dt), f"({ln} + 1) / 2", (op.length, 8)),
            init_body=ib.lines, init=init, body=body, result=res, combine_body=cb.lines,
            combine_result=cres,
        )  # fmt: skip
