"""Plan -> CUDA C (kernels + a launch schedule). Used by :mod:`hipress.compll.render`.

The same plan and statements as the C target (:class:`~hipress.compll.render_c.CFunction`),
laid out as one kernel per stage: fused loops run grid-stride over groups of elements (a group
holds whole bytes of every packed output), reductions leave one partial per block that a one-
thread kernel combines in block order (deterministic), host ``let``s run in one-thread kernels
and live in a device slot buffer, the filter is an ordered three-phase compaction, and sort / top-k
order their keys with CuPy's stable argsort (a step :mod:`hipress.compll.cuda` performs).
"""

from __future__ import annotations

from dataclasses import dataclass

import jinja2

from hipress.compll import ir
from hipress.compll.lower import lower
from hipress.compll.plan import Loop, Plan, ScatterAdd, Special, Target
from hipress.compll.render_c import CFunction
from hipress.compll.render_expr import Body, ctype, mtype
from hipress.compll.render_reduce import combine_acc, reduction
from hipress.compll.types import DType

NB = 256  # blocks of every grid-stride kernel (and partials per reduction)
NT = 256  # threads per block


@dataclass
class Launch:
    """One step of the schedule: a kernel (``grid`` "nb" or "one"), or a CuPy step."""

    kernel: str
    grid: str = "nb"
    cupy: dict[str, object] | None = None


class CudaFunction(CFunction):
    """Renders one plan as CUDA kernels; ``launches`` is the order to run them in."""

    reports_nonfinite = False  # the CUDA args have no such field (CaSync checks itself)

    def __init__(self, env: jinja2.Environment, prog: ir.Program, plan: Plan, name: str) -> None:
        super().__init__(env, prog, plan, name)
        self.kernels: list[str] = []
        self.launches: list[Launch] = []
        self.slots: dict[str, tuple[int, DType]] = {}
        self.padding: list[str] = []

    # -- scalars in slots

    def _collect_slots(self) -> None:
        for step in self.plan.steps:
            for lp in step.loops:
                for it in lp.items:
                    if it.kind == "reduce":
                        self.slots[it.op.name] = (len(self.slots), it.op.dtype)
            for sp in step.specials:
                op = sp.op
                if isinstance(op, ir.Filter | ir.TopK):
                    self.slots[op.count] = (len(self.slots), _I64)
                elif isinstance(op, ir.Reduce):
                    self.slots[op.name] = (len(self.slots), op.dtype)
            for let in step.lets:
                self.slots[let.name] = (len(self.slots), let.value.dtype)

    def _store(self, name: str, value: str) -> str:
        k, dt = self.slots[name]
        return f"{{ const {ctype(dt)} sv_ = {value}; memcpy(&a->sc[{k}], &sv_, sizeof(sv_)); }}"

    def _kernel(
        self, tag: str, title: str, code: list[str], produced: set[str], grid: str = "nb"
    ) -> str:
        name = f"{self.name}_{tag}"
        loads = []
        for s, (k, dt) in self.slots.items():
            if s not in produced:
                var = self.names.get(s)
                loads.append(
                    f"{ctype(dt)} {var}; memcpy(&{var}, &a->sc[{k}], sizeof({var})); (void){var};"
                )
        self.kernels.append(
            self.env.get_template("cuda_kernel.cu.j2").render(
                title=f"{self.prog.name}: {title}", name=name,
                args="hp_enc_args" if self.plan.fn == "encode" else "hp_dec_args",
                nws=len(self.ws), setup=self._setup_lines() + loads, code=code,
            )
        )  # fmt: skip
        self.launches.append(Launch(name, grid))
        return name

    def _setup_lines(self) -> list[str]:
        return self.length_lines + self.setup + self.safe_lines

    # -- rendering

    def render_kernels(self) -> None:
        self._inputs()
        # payload padding is written once, by the final kernel
        self.padding = [ln for ln in self.setup if ln.startswith("memset(")]
        self.setup = [ln for ln in self.setup if not ln.startswith("memset(")]
        self._arrays()
        self._collect_slots()
        for step in self.plan.steps:
            for k, lp in enumerate(step.loops):
                self.loop_kernels(lp, f"s{step.level}_{k}")
            for k, sp in enumerate(step.specials):
                self.special_kernels(sp, f"x{step.level}_{k}")
            if step.lets:
                body = Body(level=step.level)
                for let in step.lets:
                    v = self.em.expr(let.value, body, {})
                    var = self.names.get(let.name)
                    body.lines.append(f"const {ctype(let.value.dtype)} {var} = {v};")
                    body.lines.append(self._store(let.name, var))
                self._kernel(
                    f"l{step.level}", "host scalars", body.lines, {x.name for x in step.lets}, "one"
                )
        if self.plan.fn == "encode":
            self._final()
        if self.final or self.padding:
            self._kernel(
                "final",
                "payload scalars and padding, scalar state",
                self.padding + self.final,
                set(),
                "one",
            )

    def loop_kernels(self, lp: Loop, tag: str) -> None:
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
                part = self.scratch(acc.ctype, str(NB), (NB, 8))
                comb = combine_acc(acc, "sh[threadIdx.x]", "sh[threadIdx.x + s]")
                accs.append({"ctype": acc.ctype, "name": acc.name, "init": acc.init, "part": part,
                             "combine": comb})  # fmt: skip
                fin.append(f"{acc.ctype} {acc.name} = {acc.init};")
                fin.append(
                    f"for (int k = 0; k < HP_NB; k++) {combine_acc(acc, acc.name, f'{part}[k]')}"
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
        self._kernel(tag, f"level {lp.level}: {titles}", code, set())
        if fin:
            self._kernel(tag + "f", f"level {lp.level}: combine {titles}", fin, produced, "one")

    def _cuda_stores(self, m: ir.Map, targets: tuple[Target, ...], v: str, stores: list[str],
                     packs: list[dict[str, object]]) -> None:  # fmt: skip
        t = m.type
        for tg in targets:
            ptr = self.target_ptr(tg)
            if t.bits is not None and t.bits < 8:
                buf = self.names.fresh("pk")
                stores.append(f"{buf}[u] = {v};")
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

    def special_kernels(self, sp: Special, tag: str) -> None:
        op, lv = sp.op, sp.level
        home = self.target_ptr(sp.home) if sp.home is not None else ""
        if isinstance(op, ir.Filter):
            body = Body(level=lv, index="j", loop_len=op.length)
            res = self.em.apply(op.pred, ["j"], body)
            counts = self.scratch("int64_t", str(2 * NB), (2 * NB, 8))
            tpl = self.env.get_template("cuda_filter.cu.j2")
            kw = {"length": self.length(op.length), "bound": self.length(op.bound), "body": body.lines,
                  "result": res, "counts": counts, "idx": home, "slot": self.slots[op.count][0],
                  "count": self.names.get(op.count)}  # fmt: skip
            self._kernel(
                tag + "a",
                "filter: counts",
                body.hoist + tpl.render(phase=0, **kw).splitlines(),
                set(),
            )
            self._kernel(
                tag + "b",
                "filter: offsets",
                tpl.render(phase=1, **kw).splitlines(),
                {op.count},
                "one",
            )
            self._kernel(
                tag + "c",
                "filter: ordered writes",
                body.hoist + tpl.render(phase=2, **kw).splitlines(),
                set(),
            )
            return
        if isinstance(op, ir.TopK | ir.Sort):
            fn = op.key
            kdt = fn.result.dtype
            ku = "uint64_t" if kdt.bits == 64 else "uint32_t"
            body = Body(level=lv, index="j", loop_len=op.length)
            res = self.em.apply(fn, ["j"], body)
            keys = self.scratch(
                ku, self.length(op.length), (op.length, 8 if ku == "uint64_t" else 4)
            )
            kidx = len(self.ws) - 1
            ln = self.length(op.length)
            step: dict[str, object] = {"kind": "topk" if isinstance(op, ir.TopK) else "sort",
                                       "keys": kidx, "kbits": 64 if ku == "uint64_t" else 32,
                                       "length": op.length, "out": _target_spec(sp.home, self)}  # fmt: skip
            loop = [
                f"for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < {ln}; j += (int64_t)gridDim.x * blockDim.x) {{"
            ]
            loop += [f"  {x}" for x in body.lines]
            if isinstance(op, ir.TopK):
                loop.append(f"  {keys}[j] = ~hp_okey_{kdt.name}({res});")  # descending
                step["k"] = op.k
            else:
                vals = self.scratch(mtype(op.dtype), ln, (op.length, op.dtype.nbytes))
                step["vals"] = len(self.ws) - 1
                step["dtype"] = op.dtype.name
                loop.append(f"  const {ctype(op.dtype)} v = {res};")
                loop.append(f"  {keys}[j] = hp_okey_{kdt.name}(v);")
                loop.append(f"  {vals}[j] = v;")
            loop.append("}")
            self._kernel(tag + "k", "sort/topk keys", body.hoist + loop, set())
            if isinstance(op, ir.TopK):
                cnt = f"({self.length(op.k)} < {ln} ? {self.length(op.k)} : {ln})"
                self._kernel(
                    tag + "n", "topk count", [self._store(op.count, cnt)], {op.count}, "one"
                )
            self.launches.append(Launch("", "cupy", step))
            return
        if isinstance(op, ir.SegReduce):
            body = Body(level=lv, index="j", loop_len=op.length)
            res = self.em.apply(op.fn, ["j"], body)
            red = reduction(op.op, res, op.fn.result.dtype, op.dtype, "(j1 - j0)", self.names)
            accs = [{"ctype": a.ctype, "name": a.name, "init": a.init,
                     "combine": combine_acc(a, "sh[threadIdx.x]", "sh[threadIdx.x + s]")} for a in red.accs]  # fmt: skip
            code = self.env.get_template("cuda_segreduce.cu.j2").render(
                length=self.length(op.length), seg=self.length(op.seg),
                out_len=self.length(self.plan.arrays[op.name].length), accs=accs, body=body.lines,
                update=list(red.update), final=red.final, out=home,
            )  # fmt: skip
            self._kernel(tag, f"segreduce {op.op}", body.hoist + code.splitlines(), set())
            return
        # sequential stages run in one thread, as the C templates without OpenMP
        produced: set[str] = set()
        if isinstance(op, ir.Scan):
            code = self._scan_seq(op, lv, home)
        elif isinstance(op, ScatterAdd):
            self.hoisted = []
            code = self._scatter(op.op, lv, home, self._render_c).splitlines()
            code = self.hoisted + code
        else:
            assert isinstance(op, ir.Reduce)
            self.hoisted = []
            code = self._custom(op, lv, self._render_c).splitlines()
            var = self.names.get(op.name)
            code = [ln for ln in code if ln.strip() != f"{ctype(op.dtype)} {var};"]
            code = [f"{ctype(op.dtype)} {var};", *code, self._store(op.name, var)]
            produced = {op.name}
        code = [ln for ln in code if not ln.lstrip().startswith("#pragma omp")]
        self._kernel(tag, type(op).__name__.lower(), code, produced, "one")

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


_I64 = DType("i64", "int", 64)


def _target_spec(t: Target | None, fn: CudaFunction) -> dict[str, object]:
    """Where a CuPy step writes: a workspace index or a payload field (host-side views)."""
    assert t is not None
    if t.kind == "ws":
        return {"kind": "ws", "index": list(fn.ws_ptr).index(t.name)}
    return {"kind": t.kind, "name": t.name}


@dataclass(frozen=True)
class CudaSource:
    """Rendered CUDA C and, per entry point, its workspace layout and launch schedule."""

    source: str
    layouts: dict[str, list[tuple[object, int] | None]]
    schedules: dict[str, list[Launch]]
    slots: dict[str, int]


def render_cuda_program(prog: ir.Program) -> CudaSource:
    """CUDA kernels of ``prog``'s encode, decode and decode-accumulate (see module doc)."""
    from hipress.compll.render import ABI_VERSION, BANNER, environment, prelude

    env = environment()
    funcs = []
    for name, plan in (
        ("hp_encode", lower(prog, "encode")),
        ("hp_decode", lower(prog, "decode", accumulate=False)),
        ("hp_decode_acc", lower(prog, "decode", accumulate=True)),
    ):
        f = CudaFunction(env, prog, plan, name)
        f.render_kernels()
        funcs.append(f)
    kernels = [k for f in funcs for k in f.kernels]
    source = env.get_template("cuda_file.cu.j2").render(
        banner=BANNER, algorithm=prog.name, digest=prog.digest()[:16], target="cuda",
        prelude=prelude(cuda=True), nb=NB, nt=NT, kernels=kernels, abi=ABI_VERSION,
    )  # fmt: skip
    # workspace entries of the sort/topk keys carry IR lengths; the rest come from _arrays
    return CudaSource(
        source,
        {f.name: f.ws_sizes for f in funcs},
        {f.name: f.launches for f in funcs},
        {f.name: len(f.slots) for f in funcs},
    )


def render_cuda(prog: ir.Program) -> str:
    """CUDA C source of ``prog``."""
    return render_cuda_program(prog).source
