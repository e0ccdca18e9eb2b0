"""Kernel plan -> CUDA C: kernels, their launch order and the layouts the host side needs.

The CUDA target of the C-family renderer (:class:`~hipress.compll.backends.cfamily.family.CFamily`):
the same statements as the C target, laid out as *pieces*: a piece runs on the whole grid (a loop, grid-stride and coalesced; the phases of
a filter or a scatter) or on one thread (a reduction's combine of the blocks' partials, host
``let``s, a filter's offsets, a scan, the payload's scalars). A one-thread piece runs at the end of
the kernel of the grid piece before it, by the last block to finish (it counts blocks in with an
atomic), so that most stages cost one launch; sort and top-k are host steps (torch ops on the
device, :mod:`hipress.compll.backends.cuda.backend`). Kernels take one argument struct by value (8-byte fields:
pointers, state pointers and workspace offsets inline), so a launch needs no copy to the device.

Besides encode, decode and decode-accumulate: ``hp_decode_sum`` where the decode is one map over
its output (every payload decoded element by element, out written once), and the three
``hp_sparse_*`` kernels where it is a sparse decode (:mod:`hipress.compll.lower.sparse`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from jinja2 import Environment

from hipress.compll.backends.cfamily.body import Body
from hipress.compll.backends.cfamily.family import CFamily
from hipress.compll.backends.cfamily.prelude import prelude
from hipress.compll.backends.cfamily.reduce import combine_acc, reduction
from hipress.compll.backends.cfamily.syntax import ctype
from hipress.compll.backends.cuda.abi import (
    NT,
    STRUCTS,
    CudaSource,
    Entry,
    Launch,
    WsEntry,
    struct_fields,
)
from hipress.compll.backends.cuda.block import passes, render_block
from hipress.compll.backends.cuda.render_sum import decode_sum_kernel, sparse_kernels
from hipress.compll.backends.cuda.stages import STAGES
from hipress.compll.backends.render import ABI_VERSION, BANNER, environment
from hipress.compll.ir import nodes as ir
from hipress.compll.ir.types import I64, DType
from hipress.compll.lower.kernel_plan import Destination, KernelPlan, Loop
from hipress.compll.lower.lower import Lowered, lower_program


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


class CudaFunction(CFamily):
    """Renders one plan as CUDA kernels (see module doc): :meth:`render_kernels`, then
    ``kernels`` (source texts) and :meth:`entry`."""

    reports_nonfinite = True  # hp_enc_args.nonfinite: a device byte

    def __init__(self, env: Environment, prog: ir.Program, plan: KernelPlan, name: str) -> None:
        super().__init__(env, prog, plan, name)
        self.kernels: list[str] = []
        self.launches: list[Launch] = []
        self.pieces: list[Piece] = []
        self.slots: dict[str, tuple[int, DType]] = {}
        self.padding: list[str] = []
        self.struct = "hp_enc_args" if plan.fn == "encode" else "hp_dec_args"

    # -- slots

    def slot(self, name: str, dt: DType) -> int:
        """The index of scalar ``name`` in the argument struct's scalar slots."""
        if name not in self.slots:
            self.slots[name] = (len(self.slots), dt)
        return self.slots[name][0]

    def _collect_slots(self) -> None:
        for step in self.plan.steps:
            for lp in step.loops:
                for it in lp.items:
                    if it.kind == "reduce":
                        self.slot(it.op.name, it.op.dtype)
            for sp in step.specials:
                op = sp.op
                if isinstance(op, ir.Filter | ir.TopK):
                    self.slot(op.count, I64)
                elif isinstance(op, ir.Reduce):
                    self.slot(op.name, op.dtype)
            for let in step.lets:
                self.slot(let.name, let.value.dtype)

    def store_scalar(self, name: str, value: str) -> str:
        """The statement storing scalar ``name``'s ``value`` in its slot."""
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

    def piece(self, title: str, code: list[str], produced: set[str] | frozenset[str] = frozenset(),
              grid: bool = True, scalar: bool = False) -> None:  # fmt: skip
        """Append a piece (see the module docstring) that produces the scalars ``produced``."""
        self.pieces.append(
            Piece(f"{self.prog.name}: {title}", code, frozenset(produced), grid, scalar=scalar)
        )

    def host_step(self, kind: str, step: dict[str, object]) -> None:
        """Append a host step (see :mod:`hipress.compll.backends.cuda.backend`)."""
        self.pieces.append(Piece(f"{self.prog.name}: {kind}", [], host=step))

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
        self.inputs()
        # payload padding is written once, by the final piece
        self.padding = [ln for ln in self.setup if ln.startswith("memset(")]
        self.setup = [ln for ln in self.setup if not ln.startswith("memset(")]
        self.arrays()
        self._collect_slots()
        for step in self.plan.steps:
            for lp in step.loops:
                self.loop_pieces(lp)
            for sp in step.specials:
                if isinstance(sp.op, ir.Block):
                    render_block(self, sp)
                else:
                    STAGES[type(sp.op)](self, sp)
            if step.lets:
                body = Body(level=step.level)
                for let in step.lets:
                    v = self.em.expr(let.value, body, {})
                    var = self.names.get(let.name)
                    body.lines.append(f"const {ctype(let.value.dtype)} {var} = {v};")
                    body.lines.append(self.store_scalar(let.name, var))
                self.piece("host scalars", body.hoist + body.lines,
                            {x.name for x in step.lets}, grid=False, scalar=True)  # fmt: skip
        if self.plan.fn == "encode":
            self.finish()
        if self.final or self.padding:
            self.piece("payload scalars and padding, scalar state", self.padding + self.final,
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
            fin.append(self.store_scalar(it.op.name, red.final))
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
        self.piece(f"level {lp.level}: {titles}", code)
        if fin:
            self.piece(f"combine {titles}", fin, produced, grid=False)

    def _cuda_stores(self, m: ir.Map, targets: tuple[Destination, ...], v: str, stores: list[str],
                     packs: list[dict[str, object]]) -> None:  # fmt: skip
        """The statements storing ``v`` to each target; packed arrays go through a buffer of
        a thread's group of elements (``packs``)."""
        t = m.type
        for tg in targets:
            if t.bits is not None and t.bits < 8:
                buf = self.names.fresh("pk")
                stores.append(f"{buf}[e] = {v};")
                packs.append({"buf": buf, "ptr": self.target_ptr(tg), "bits": t.bits,
                              "per": 8 // t.bits})  # fmt: skip
            else:
                stores.append(self.store(tg, t.dtype, v))


def _ws_entry(size: object) -> WsEntry:
    if isinstance(size, WsEntry):
        return size
    assert isinstance(size, tuple)
    length, item = size
    return WsEntry(length, int(item))


def render_program(prog: ir.Program, plans: Lowered) -> CudaSource:
    """CUDA kernels of ``prog``'s encode, decode and decode-accumulate from its plans (lowered
    for a target that runs every loop on its own), and its decode_sum or sparse decode kernels
    where it has them (see module doc)."""
    prog = passes(prog)  # a section too big for shared memory runs as its ops
    env = environment()
    dec = plans.decode
    funcs = []
    for name, plan in (
        ("hp_encode", plans.encode),
        ("hp_decode", dec),
        ("hp_decode_acc", plans.decode_acc),
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
    sparse = sparse_kernels(env, prog, dec, plans.sparse)
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


def lower(prog: ir.Program) -> Lowered:
    """The plans the CUDA target renders ``prog`` from: every loop on its own (its encode's
    NaN/Inf flag may go in a loop the C target fuses), each section that fits in shared
    memory as one stage (:mod:`hipress.compll.backends.cuda.block`)."""
    return lower_program(passes(prog), unfused=True, sections=True)


def cuda_source(prog: ir.Program) -> CudaSource:
    """CUDA source of ``prog`` with the layouts its host side needs, lowered here (see
    :func:`render_program`); equal programs give byte-identical text."""
    return render_program(prog, lower(prog))


__all__ = ["cuda_source", "lower", "render_program"]
