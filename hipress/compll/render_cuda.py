"""Plan -> CUDA C: kernels, their launch order and the layouts the host side needs.

The same plan and statements as the C target (:class:`~hipress.compll.render_c.CFunction`), laid
out as *pieces*: a piece runs on the whole grid (a loop, grid-stride and coalesced; the phases of
a filter or a scatter) or on one thread (a reduction's combine of the blocks' partials, host
``let``s, a filter's offsets, a scan, the payload's scalars). A one-thread piece runs at the end of
the kernel of the grid piece before it, by the last block to finish (it counts blocks in with an
atomic), so that most stages cost one launch; sort and top-k are host steps (torch ops on the
device, :mod:`hipress.compll.cuda`). Kernels take one argument struct by value (8-byte fields:
pointers, state pointers and workspace offsets inline), so a launch needs no copy to the device.

Besides encode, decode and decode-accumulate: ``hp_decode_sum`` where the decode is one map over
its output (every payload decoded element by element, out written once), and the three
``hp_sparse_*`` kernels where it is a sparse decode (:mod:`hipress.compll.sparse`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import jinja2

from hipress.compll import ir
from hipress.compll.cuda_abi import (
    NT,
    STRUCTS,
    CudaSource,
    Entry,
    Launch,
    WsEntry,
    struct_fields,
)
from hipress.compll.lower import lower
from hipress.compll.plan import Loop, Plan, ScatterAdd, Special, Target
from hipress.compll.render_c import CFunction
from hipress.compll.render_cuda_sum import decode_sum_kernel, sparse_kernels
from hipress.compll.render_expr import Body, ctype, mtype
from hipress.compll.render_reduce import combine_acc, reduction
from hipress.compll.types import BOOL, I64, DType


@dataclass
class Piece:
    title: str
    code: list[str]
    produced: frozenset[str] = frozenset()
    grid: bool = True
    host: dict[str, object] | None = None
    scalar: bool = False  # host scalars only: every thread may compute them (a prologue)


@dataclass
class _Kernel:
    grid: bool
    main: Piece | None
    tails: list[Piece] = field(default_factory=list)
    prologue: list[Piece] = field(default_factory=list)


_I64 = DType("i64", "int", 64)


class CudaFunction(CFunction):
    """Renders one plan as CUDA kernels (see module doc): :meth:`render_kernels`, then
    ``kernels`` (source texts) and :meth:`entry`."""

    reports_nonfinite = True  # hp_enc_args.nonfinite: a device byte

    def __init__(self, env: jinja2.Environment, prog: ir.Program, plan: Plan, name: str) -> None:
        super().__init__(env, prog, plan, name)
        self.kernels: list[str] = []
        self.launches: list[Launch] = []
        self.pieces: list[Piece] = []
        self.slots: dict[str, tuple[int, DType]] = {}
        self.padding: list[str] = []
        self.struct = "hp_enc_args" if plan.fn == "encode" else "hp_dec_args"

    # -- slots

    def _slot(self, name: str, dt: DType) -> int:
        if name not in self.slots:
            self.slots[name] = (len(self.slots), dt)
        return self.slots[name][0]

    def _collect_slots(self) -> None:
        for step in self.plan.steps:
            for lp in step.loops:
                for it in lp.items:
                    if it.kind == "reduce":
                        self._slot(it.op.name, it.op.dtype)
            for sp in step.specials:
                op = sp.op
                if isinstance(op, ir.Filter | ir.TopK):
                    self._slot(op.count, _I64)
                elif isinstance(op, ir.Reduce):
                    self._slot(op.name, op.dtype)
            for let in step.lets:
                self._slot(let.name, let.value.dtype)

    def _store(self, name: str, value: str) -> str:
        k, dt = self.slots[name]
        return f"{{ const {ctype(dt)} sv_ = {value}; memcpy(&a->sc[{k}], &sv_, sizeof(sv_)); }}"

    def _loads(self, produced: frozenset[str]) -> list[str]:
        out = []
        for s, (k, dt) in self.slots.items():
            if s not in produced:
                var = self.names.get(s)
                out.append(
                    f"{ctype(dt)} {var}; memcpy(&{var}, &a->sc[{k}], sizeof({var})); (void){var};"
                )
        return out

    # -- pieces and kernels

    def _piece(self, title: str, code: list[str], produced: set[str] | frozenset[str] = frozenset(),
               grid: bool = True, scalar: bool = False) -> None:  # fmt: skip
        self.pieces.append(
            Piece(f"{self.prog.name}: {title}", code, frozenset(produced), grid, scalar=scalar)
        )

    def _groups(self) -> list[_Kernel | Piece]:
        """Kernels from the pieces: each grid piece starts a kernel and the one-thread pieces
        after it run at its end; one-thread pieces with no grid piece before them (at the
        start, after a host step) form a kernel of their own, unless they are host scalars
        only and a grid piece follows: then every thread of that kernel computes them first
        (a prologue), one launch fewer."""
        groups: list[_Kernel | Piece] = []
        cur: _Kernel | None = None
        for p in self.pieces:
            if p.host is not None:
                groups.append(p)
                cur = None
            elif p.grid:
                if cur is not None and cur.main is None and all(t.scalar for t in cur.tails):
                    cur.main, cur.grid, cur.prologue, cur.tails = p, True, cur.tails, []
                else:
                    cur = _Kernel(True, p)
                    groups.append(cur)
            else:
                if cur is None:
                    cur = _Kernel(False, None)
                    groups.append(cur)
                cur.tails.append(p)
        return groups

    def _assemble(self) -> None:
        for g in self._groups():
            if isinstance(g, Piece):
                self.launches.append(Launch("", "host", g.host))
                continue
            name = f"{self.name}_{len(self.kernels)}"
            parts = g.prologue + ([g.main] if g.main else []) + g.tails
            tails = [self._loads(t.produced) + t.code for t in g.tails]
            main = g.main.code if g.main else []
            setup = self.length_lines + self.setup + self.safe_lines
            if g.main:
                early = frozenset().union(*(p.produced for p in g.prologue))
                setup = setup + self._loads(g.main.produced | early)
                # the prologue's scalars: every thread computes them, one thread stores them
                for p in g.prologue:
                    setup += [
                        f"if (blockIdx.x == 0 && threadIdx.x == 0) {ln}"
                        if ln.startswith("{ const ") and "memcpy(&a->sc[" in ln
                        else ln
                        for ln in p.code
                    ]
            self.kernels.append(
                self.env.get_template("cuda_kernel.cu.j2").render(
                    title="; ".join(p.title for p in parts), name=name, args=self.struct,
                    nws=len(self.ws), setup=setup, code=main, tails=tails, grid=g.grid,
                    tail_title="; ".join(t.title.split(": ", 1)[1] for t in g.tails),
                )
            )  # fmt: skip
            self.launches.append(Launch(name, "grid" if g.grid else "one"))

    def entry(self) -> Entry:
        ws = tuple(_ws_entry(s) for s in self.ws_sizes)
        return Entry(self.struct, tuple(self.launches), ws, len(self.slots),
                     self.plan.fn == "encode" and self.plan.nonfinite is not None)  # fmt: skip

    # -- rendering

    def render_kernels(self) -> None:
        self._inputs()
        # payload padding is written once, by the final piece
        self.padding = [ln for ln in self.setup if ln.startswith("memset(")]
        self.setup = [ln for ln in self.setup if not ln.startswith("memset(")]
        self._arrays()
        self._collect_slots()
        for step in self.plan.steps:
            for lp in step.loops:
                self.loop_pieces(lp)
            for sp in step.specials:
                self.special_pieces(sp)
            if step.lets:
                body = Body(level=step.level)
                for let in step.lets:
                    v = self.em.expr(let.value, body, {})
                    var = self.names.get(let.name)
                    body.lines.append(f"const {ctype(let.value.dtype)} {var} = {v};")
                    body.lines.append(self._store(let.name, var))
                self._piece("host scalars", body.hoist + body.lines,
                            {x.name for x in step.lets}, grid=False, scalar=True)  # fmt: skip
        if self.plan.fn == "encode":
            self._final()
        if self.final or self.padding:
            self._piece("payload scalars and padding, scalar state", self.padding + self.final,
                        grid=False)  # fmt: skip
        self._assemble()

    def loop_pieces(self, lp: Loop) -> None:
        ln = self.length(lp.length)
        body = Body(level=lp.level, index="i", loop_len=lp.length, fuse=True)
        accs: list[dict[str, str]] = []
        stores: list[str] = []
        packs: list[dict[str, object]] = []
        fin: list[str] = []
        produced: set[str] = set()
        for it in lp.items:
            body.copy = it.copy
            v = self.em.apply(it.op.fn, ["i"], body)
            if it.kind == "store":
                assert isinstance(it.op, ir.Map)
                self._cuda_stores(it.op, it.targets, v, stores, packs)
                continue
            assert isinstance(it.op, ir.Reduce)
            red = reduction(it.op.op, v, it.op.fn.result.dtype, it.op.dtype, ln, self.names)
            body.lines += red.update
            for acc in red.accs:
                part = self.scratch(acc.ctype, "0", WsEntry(0, 8, 1))
                comb = combine_acc(acc, "sh[threadIdx.x]", "sh[threadIdx.x + s]")
                accs.append({"ctype": acc.ctype, "name": acc.name, "init": acc.init, "part": part,
                             "combine": comb})  # fmt: skip
                fin.append(f"{acc.ctype} {acc.name} = {acc.init};")
                fin.append(
                    f"for (unsigned int k = 0; k < gridDim.x; k++) "
                    f"{combine_acc(acc, acc.name, f'{part}[k]')}"
                )
            fin.append(self._store(it.op.name, red.final))
            produced.add(it.op.name)
        body.copy = False
        group = max([int(p["per"]) for p in packs] + [1])  # type: ignore[call-overload]
        code = (
            body.hoist
            + self.env.get_template("cuda_loop.cu.j2")
            .render(length=ln, group=group, accs=accs, packs=packs, body=body.lines + stores)
            .splitlines()
        )
        titles = ", ".join(it.op.name for it in lp.items)
        self._piece(f"level {lp.level}: {titles}", code)
        if fin:
            self._piece(f"combine {titles}", fin, produced, grid=False)

    def _cuda_stores(self, m: ir.Map, targets: tuple[Target, ...], v: str, stores: list[str],
                     packs: list[dict[str, object]]) -> None:  # fmt: skip
        t = m.type
        for tg in targets:
            ptr = self.target_ptr(tg)
            if t.bits is not None and t.bits < 8:
                buf = self.names.fresh("pk")
                stores.append(f"{buf}[e] = {v};")
                packs.append({"buf": buf, "ptr": ptr, "bits": t.bits, "per": 8 // t.bits})
            elif tg.kind == "outacc":
                stores.append(f"out[i] = out[i] + {v};")
            elif t.dtype.is_bool:
                stores.append(f"{ptr}[i] = (uint8_t)({v});")
            elif tg.kind == "payload" and t.dtype.is_float:
                stores.append(f"{ptr}[i] = hp_canon_{t.dtype.name}({v});")
            else:
                stores.append(f"{ptr}[i] = {v};")

    # -- specials

    def special_pieces(self, sp: Special) -> None:
        op, lv = sp.op, sp.level
        home = self.target_ptr(sp.home) if sp.home is not None else ""
        if isinstance(op, ir.Filter):
            self._filter_pieces(op, lv, home)
        elif isinstance(op, ir.TopK | ir.Sort):
            self._select_pieces(op, sp, lv)
        elif isinstance(op, ir.SegReduce):
            body = Body(level=lv, index="j", loop_len=op.length)
            res = self.em.apply(op.fn, ["j"], body)
            red = reduction(op.op, res, op.fn.result.dtype, op.dtype, "(j1 - j0)", self.names)
            accs = [{"ctype": a.ctype, "name": a.name, "init": a.init,
                     "combine": combine_acc(a, "sh[threadIdx.x]", "sh[threadIdx.x + s]")}
                    for a in red.accs]  # fmt: skip
            code = self.env.get_template("cuda_segreduce.cu.j2").render(
                length=self.length(op.length), seg=self.length(op.seg),
                out_len=self.length(self.plan.arrays[op.name].length), accs=accs, body=body.lines,
                update=list(red.update), final=red.final, out=home,
            )  # fmt: skip
            self._piece(f"segreduce {op.op}", body.hoist + code.splitlines())
        elif isinstance(op, ScatterAdd):
            self._scatter_pieces(op.op, lv, home)
        elif isinstance(op, ir.Scan):
            self._piece("scan", self._scan_seq(op, lv, home), grid=False)
        else:
            assert isinstance(op, ir.Reduce)
            self.hoisted = []
            code = self._custom(op, lv, self._render_c).splitlines()
            var = self.names.get(op.name)
            code = [ln for ln in code if ln.strip() != f"{ctype(op.dtype)} {var};"]
            code = [f"{ctype(op.dtype)} {var};", *self.hoisted, *code, self._store(op.name, var)]
            code = [ln for ln in code if not ln.lstrip().startswith("#pragma omp")]
            self._piece("custom reduce", code, {op.name}, grid=False)

    def _filter_pieces(self, op: ir.Filter, lv: int, home: str) -> None:
        body = Body(level=lv, index="j", loop_len=op.length)
        res = self.em.apply(op.pred, ["j"], body)
        counts = self.scratch("int64_t", "0", WsEntry(0, 8, 2))
        slot = self._slot(op.count, _I64)
        tpl = self.env.get_template("cuda_filter.cu.j2")
        kw = {"length": self.length(op.length), "bound": self.length(op.bound), "body": body.lines,
              "result": res, "counts": counts, "idx": home, "slot": slot,
              "count": self.names.get(op.count)}  # fmt: skip
        self._piece("filter: counts", body.hoist + tpl.render(phase=0, **kw).splitlines())
        self._piece("filter: offsets", tpl.render(phase=1, **kw).splitlines(), {op.count}, False)
        self._piece("filter: ordered writes", body.hoist + tpl.render(phase=2, **kw).splitlines())

    def _select_pieces(self, op: ir.TopK | ir.Sort, sp: Special, lv: int) -> None:
        fn = op.key
        kdt = fn.result.dtype
        ku = "uint64_t" if kdt.bits == 64 else "uint32_t"
        body = Body(level=lv, index="j", loop_len=op.length)
        res = self.em.apply(fn, ["j"], body)
        kb = 8 if ku == "uint64_t" else 4
        keys = self.scratch(ku, self.length(op.length), WsEntry(op.length, kb))
        ln = self.length(op.length)
        step: dict[str, object] = {"kind": "topk" if isinstance(op, ir.TopK) else "sort",
                                   "keys": len(self.ws) - 1, "kbits": 8 * kb,
                                   "length": op.length, "out": _target_spec(sp.home, self)}  # fmt: skip
        loop = [
            f"for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < {ln}; "
            "j += (int64_t)gridDim.x * blockDim.x) {"
        ]
        loop += [f"  {x}" for x in body.lines]
        if isinstance(op, ir.TopK):
            loop.append(f"  {keys}[j] = ~hp_okey_{kdt.name}({res});")  # descending
            step["k"] = op.k
        else:
            vals = self.scratch(mtype(op.dtype), ln, WsEntry(op.length, op.dtype.nbytes))
            step["vals"] = len(self.ws) - 1
            step["dtype"] = op.dtype.name
            loop.append(f"  const {ctype(op.dtype)} v = {res};")
            loop.append(f"  {keys}[j] = hp_okey_{kdt.name}(v);")
            loop.append(f"  {vals}[j] = v;")
        loop.append("}")
        self._piece("sort/topk keys", body.hoist + loop)
        if isinstance(op, ir.TopK):
            cnt = f"({self.length(op.k)} < {ln} ? {self.length(op.k)} : {ln})"
            self._piece("topk count", [self._store(op.count, cnt)], {op.count}, grid=False)
        self.pieces.append(Piece(f"{self.prog.name}: {step['kind']}", [], host=step))

    def _scatter_pieces(self, op: ir.Scatter, lv: int, home: str) -> None:
        idx_a = self.plan.arrays[op.idx]
        j = ir.Ref("__j", I64)
        at_idx = ir.Load(op.idx, j, idx_a.dtype)

        def idx_at(var: str, body: Body) -> str:
            return self.em.load(at_idx, body, {"__j": var})

        body = Body(level=lv, index="j", loop_len=idx_a.length)
        index = idx_at("j", body)
        val = self.em.load(ir.Load(op.vals, j, op.dtype), body, {"__j": "j"})
        cur = Body(level=lv, index="j", loop_len=idx_a.length)
        prev = Body(level=lv, index="j", loop_len=idx_a.length)
        ends = Body(level=lv)
        c_cur, c_prev = idx_at("j", cur), idx_at("jm", prev)
        first, last = idx_at("j0", ends), idx_at("jl", ends)
        cb = Body(level=lv)
        count = self.em.expr(op.count, cb, {})
        dt = op.dtype
        add = (
            (lambda a, b: f"({a} + {b})")
            if dt.is_float
            else (lambda a, b: f"hp_add_{dt.name}({a}, {b})")
        )
        counts = self.scratch("int64_t", "0", WsEntry(0, 8, 1))
        ok_name = self.names.fresh("__scatter_ok")
        slot = self._slot(ok_name, BOOL)
        tpl = self.env.get_template("cuda_scatter.cu.j2")
        kw = {"out_name": op.name, "length": self.length(op.length), "count": count,
              "idx_len": self.length(idx_a.length), "out": home, "vt": mtype(dt),
              "body": body.lines, "index": index, "value": val, "add": add, "counts": counts,
              "cur_body": cur.lines, "prev_body": prev.lines, "cur": c_cur, "prev": c_prev,
              "ends_body": ends.lines, "first": first, "last": last, "slot": slot,
              "ok": self.names.get(ok_name)}  # fmt: skip
        hoist = cb.lines + body.hoist + cur.hoist + prev.hoist
        self._piece("scatter: descents", hoist + tpl.render(phase=0, **kw).splitlines())
        self._piece("scatter: parallel?", cb.lines + ends.hoist + tpl.render(phase=1, **kw).splitlines(),
                    {ok_name}, grid=False)  # fmt: skip
        self._piece(f"scatter-add into {op.name}", hoist + tpl.render(phase=2, **kw).splitlines())

    def _render_c(self, tpl: str, /, **kw: object) -> str:
        return self.env.get_template(tpl).render(level=0, **kw)

    def _scan_seq(self, op: ir.Scan, lv: int, home: str) -> list[str]:
        body = Body(level=lv, index="j", loop_len=op.length)
        res = self.em.apply(op.fn, ["j"], body)
        dt = op.dtype
        ln = self.length(op.length)
        if op.op == "sum" and dt.is_float:
            acc, init, upd, out = "double", "0.0", f"acc += (double)({res});", f"({ctype(dt)})acc"
        elif op.op == "sum":
            acc, init, upd, out = ctype(dt), "0", f"acc = hp_add_{dt.name}(acc, {res});", "acc"
        else:
            from hipress.compll.render_reduce import _ident_minmax

            acc, init, upd, out = (
                ctype(dt),
                _ident_minmax(op.op, dt),
                f"acc = hp_{op.op}_{dt.name}(acc, {res});",
                "acc",
            )
        lines = [f"{acc} acc = {init};", f"for (int64_t j = 0; j < {ln}; j++) {{"]
        lines += [f"  {x}" for x in body.lines] + [f"  {upd}", f"  {home}[j] = {out};", "}"]
        return body.hoist + lines


def _ws_entry(size: object) -> WsEntry:
    if isinstance(size, WsEntry):
        return size
    assert isinstance(size, tuple)
    length, item = size
    return WsEntry(length, int(item))


def _target_spec(t: Target | None, fn: CudaFunction) -> dict[str, object]:
    """Where a host step writes: a workspace index or a payload field."""
    assert t is not None
    if t.kind == "ws":
        return {"kind": "ws", "index": list(fn.ws_ptr).index(t.name)}
    return {"kind": t.kind, "name": t.name}


def render_cuda_program(prog: ir.Program) -> CudaSource:
    """CUDA kernels of ``prog``'s encode, decode and decode-accumulate, and its decode_sum or
    sparse decode kernels where it has them (see module doc)."""
    from hipress.compll.render import ABI_VERSION, BANNER, environment, prelude

    env = environment()
    dec = lower(prog, "decode", accumulate=False)
    funcs = []
    for name, plan in (
        ("hp_encode", lower(prog, "encode", nonfinite=True, unfused=True)),
        ("hp_decode", dec),
        ("hp_decode_acc", lower(prog, "decode", accumulate=True)),
    ):
        f = CudaFunction(env, prog, plan, name)
        f.render_kernels()
        funcs.append(f)
    kernels = [k for f in funcs for k in f.kernels]
    nws_dec = max(len(f.ws) for f in funcs[1:])
    structs = {
        STRUCTS["enc"]: struct_fields("enc", len(prog.state), len(funcs[0].ws)),
        STRUCTS["dec"]: struct_fields("dec", 0, nws_dec),
    }
    dsum = decode_sum_kernel(env, prog, dec)
    sparse = sparse_kernels(env, prog, dec)
    if dsum is not None:
        structs[STRUCTS["dsum"]] = struct_fields("dsum")
        kernels.append(dsum)
    if sparse is not None:
        structs[STRUCTS["sparse"]] = struct_fields("sparse")
        kernels.append(sparse)
    source = env.get_template("cuda_file.cu.j2").render(
        banner=BANNER, algorithm=prog.name, digest=prog.digest()[:16], target="cuda",
        prelude=prelude(cuda=True), nt=NT, kernels=kernels, abi=ABI_VERSION,
        structs=[{"name": k, "fields": v} for k, v in structs.items()],
    )  # fmt: skip
    entries = {f.name: f.entry() for f in funcs}
    names = {ln.kernel: e.struct for e in entries.values() for ln in e.launches if ln.kernel}
    if dsum is not None:
        names["hp_decode_sum"] = STRUCTS["dsum"]
    if sparse is not None:
        names |= {f"hp_sparse_{k}": STRUCTS["sparse"] for k in ("check", "scatter", "finish")}
    return CudaSource(source, entries, structs, dsum is not None, sparse is not None, names)


def render_cuda(prog: ir.Program) -> str:
    """CUDA C source of ``prog``."""
    return render_cuda_program(prog).source
