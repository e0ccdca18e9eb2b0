"""Kernel plan -> C (OpenMP, vectorisable tile loops): the C target of the C-family renderer.

Python decides what each loop computes and forms the statements; the templates
(``templates/c_*.j2``) hold the layout of the file, the functions, the loops and the special
stages (:mod:`hipress.compll.backends.c.stages`, one rule per stage kind).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from jinja2 import Environment

from hipress.compll.backends.c.block import TILE, pack_lines, render_block
from hipress.compll.backends.c.lut import lut_stage, run_stage
from hipress.compll.backends.c.stages import STAGES
from hipress.compll.backends.cfamily.body import Body, variants
from hipress.compll.backends.cfamily.family import STORES, CFamily, StoreRule, store_bool
from hipress.compll.backends.cfamily.reduce import combine_acc, reduction
from hipress.compll.backends.cfamily.syntax import const, ctype, mtype
from hipress.compll.ir import nodes as ir
from hipress.compll.ir import ops
from hipress.compll.ir.types import DType
from hipress.compll.ir.walk import walk
from hipress.compll.lower.kernel_plan import Destination, Item, KernelPlan, Loop, SegFusion, Special

# the C layout (TILE, elements per tile of an inner loop: from block.py), most threads, length
# below which one thread
MAXT = 64
PAR_MIN = 16384


@dataclass
class Tile:
    """The rendered parts of one fused loop (see :meth:`CFunction._tile`)."""

    titles: list[str] = field(default_factory=list)
    hoist: str = ""
    decls: list[str] = field(default_factory=list)
    partials: list[dict[str, str]] = field(default_factory=list)
    clauses: list[str] = field(default_factory=list)
    finish: list[str] = field(default_factory=list)
    pre: list[str] = field(default_factory=list)
    variants: list[dict[str, object]] = field(default_factory=list)
    post: list[str] = field(default_factory=list)


def _f16_tile(f: CFamily, tg: Destination, dt: DType, ptr: str, v: str) -> str | None:
    """An f16 store of a converted f32 value: the tile's f32 values are collected and
    converted with F16C after the tile loop."""
    if not (
        isinstance(f, CFunction)
        and dt.name == "f16"
        and v.startswith("hp_f32_to_f16(")
        and _balanced(v)
    ):
        return None
    buf = f.names.fresh("cv")
    f.f16_tiles.append((buf, ptr, tg.kind == "payload", v))
    return f"{buf}[t] = {v[len('hp_f32_to_f16(') : -1]};"


class CFunction(CFamily):
    """Renders one plan as a C function (:meth:`render`): OpenMP tile loops, the special
    stages by :data:`~hipress.compll.backends.c.stages.STAGES`, f16 stores converted per tile."""

    STORES: tuple[StoreRule, ...] = tuple(
        r for rule in STORES for r in ((rule, _f16_tile) if rule is store_bool else (rule,))
    )

    def __init__(
        self, env: Environment, prog: ir.Program, plan: KernelPlan, name: str, tile: bool = False
    ) -> None:
        super().__init__(env, prog, plan, name, tile)
        self.f16_tiles: list[tuple[str, str, bool, str]] = []
        self.prep = False  # a tile's tables and unpacked values only (render_prep)
        self.prepared = False

    def scaled(self, v: str) -> str:
        """A decoded value as a tile function stores it: divided by the divisor, or multiplied
        by its reciprocal where the caller says the divisor is a power of two (``hp_pw``, a
        constant at each inlined call, so each variant's loop has one operation)."""
        return f"(hp_pw ? ({v}) * hp_d : ({v}) / hp_d)" if self.tile else v

    def render(self) -> str:
        """The C function: its loops, stages and host lets, level by level (fused loops run
        by their segment reduction or filter)."""
        self.inputs()
        self.arrays()
        stages: list[str] = []
        fused = {id(lp) for f in self.plan.fusions for lp in f.seg_loops + f.elem_loops}
        fused |= {id(f.loop) for f in self.plan.filter_fusions}  # run by their filter
        groups = {id(f.special): f for f in self.plan.fusions}
        for step in self.plan.steps:
            for lp in step.loops:
                if id(lp) not in fused:
                    stages.append(self.loop(lp))
            for sp in step.specials:
                f = groups.get(id(sp))
                stages.append(self.special(sp) if f is None else self.segfused(f))
            for let in step.lets:
                body = Body(level=step.level)
                v = self.em.expr(let.value, body, {})
                var = self.names.get(let.name)
                stages += [f"  {ln}" for ln in body.lines]
                stages.append(f"  const {ctype(let.value.dtype)} {var} = {v};")
        if self.plan.fn == "encode":
            self.finish()
        if self.tile:
            return self.env.get_template("c_tile_function.c.j2").render(
                title=f"{self.prog.name}: {self.name}",
                name=self.name,
                setup=self.length_lines + self.setup + self.safe_lines,
                stages=stages,
                prep=self.prep,
            )
        tpl = self.env.get_template("c_function.c.j2")
        return tpl.render(
            title=f"{self.prog.name}: {self.name}",
            name=self.name,
            args="hp_enc_args" if self.plan.fn == "encode" else "hp_dec_args",
            lengths=self.length_lines,
            ws=self.ws,
            setup=self.length_lines + self.setup + self.safe_lines,
            stages=stages,
            final=self.final,
        )

    def render_prep(self) -> str | None:
        """The tile function that fills the caller's buffers with a tile's look-up tables
        and unpacked values (a tabulated decode: :mod:`.lut`), or None if not tabulated."""
        assert self.tile, "a prep function is a tile function"
        self.prep = True
        text = self.render()
        return text if self.prepared else None

    def _tile_stage(self, lp: Loop) -> str:
        """A tile function's one tile of ``lp``, element by element."""
        tile = self.tile_parts(lp)
        return tile.hoist + self.env.get_template("c_tile_stage.c.j2").render(
            level=lp.level, title=", ".join(tile.titles), pre=tile.pre, clauses="",
            variants=tile.variants, post=tile.post,
        )  # fmt: skip

    def special(self, sp: Special) -> str:
        """A stage of its own, by its rule in :data:`STAGES`, after its host code."""
        self.hoisted = []
        text = (
            render_block(self, sp) if isinstance(sp.op, ir.Block) else STAGES[type(sp.op)](self, sp)
        )
        return "".join(f"  {ln}\n" for ln in self.hoisted) + text

    def loop(self, lp: Loop) -> str:
        """``lp`` as an OpenMP loop of tiles (in a tile function: the one tile's loop, or a
        table of its values where it has few: :mod:`.lut`)."""
        if self.tile:
            plain = lambda: self._tile_stage(lp)  # noqa: E731
            if self.prep:
                text = lut_stage(self, lp, plain)
                self.prepared = text is not None
                return text or ""
            return lut_stage(self, lp, plain) or run_stage(self, lp, plain) or plain()
        tile = self.tile_parts(lp, aligned=True)  # i0 = tb * HP_TILE
        tpl = self.env.get_template("c_loop.c.j2")
        text = tile.hoist + tpl.render(
            level=lp.level, title=", ".join(tile.titles), length=self.length(lp.length),
            partials=tile.partials, pre=tile.pre, clauses="".join(tile.clauses),
            variants=tile.variants, post=tile.post, finish=tile.finish,
        )  # fmt: skip
        # reductions of nothing but values that a loop-invariant conjunct may make all false:
        # where every such conjunct is false, the results without the pass
        guards, empties = [], []
        for it in lp.items:
            if not (
                isinstance(it.op, ir.Reduce)
                and it.op.op in (ops.REDUCE_ANY.name, ops.REDUCE_COUNT.name)
            ):
                break
            guard = self.guard(it.op.fn, lp.level)
            if guard is None:
                break
            guards.append(guard)
            empty = "false" if it.op.op == ops.REDUCE_ANY.name else "INT64_C(0)"
            empties.append(f"    {self.names.get(it.op.name)} = {empty};\n")
        else:
            cond = " || ".join(f"({g})" for g in guards)
            text = f"  if ({cond}) {{\n{text}\n  }} else {{\n{''.join(empties)}  }}"
        return "\n".join([*tile.decls, text])

    def guard(self, fn: ir.Lambda, level: int) -> str | None:
        """C for the loop-invariant conjuncts of ``fn``'s boolean result (scalars and
        constants only), when there are any: where they are false, so is every value."""
        parts: list[ir.Expr] = []
        stack = [fn.result]
        while stack:
            e = stack.pop()
            if isinstance(e, ir.Binary) and e.op == "and":
                stack += [e.b, e.a]
            else:
                parts.append(e)
        local = {p.name for p in fn.params} | {name for name, _ in fn.lets}
        inv = [
            e
            for e in parts
            if not any(
                isinstance(x, ir.Load | ir.Rand) or (isinstance(x, ir.Ref) and x.name in local)
                for x in walk(e)
            )
        ]
        if not inv or len(inv) == len(parts):
            return None
        body = Body(level=level)
        code = " && ".join(f"({self.em.expr(e, body, {})})" for e in inv)
        return None if body.lines else code

    def tile_parts(
        self, lp: Loop, memo: dict[tuple[str, str], str] | None = None, aligned: bool = False
    ) -> Tile:
        """The parts of ``lp``'s tile loop: per-tile code before and after, the body variants,
        reduction partials, and host code to run before the loop (``memo``: reads already
        in variables; ``aligned``: see :attr:`Body.aligned`)."""
        ln = self.length(lp.length)
        body = Body(level=lp.level, index="i", loop_len=lp.length, fuse=True, tile="t",
                    aligned=aligned)  # fmt: skip
        body.memo.update(memo or {})
        tile = Tile()
        stores: list[str] = []
        packs: list[tuple[str, str, int]] = []  # (buffer, dst pointer, bits)
        for it in lp.items:
            body.copy = it.copy
            if it.kind == "store":
                assert isinstance(it.op, ir.Map)
                tile.titles.append(it.op.name)
                v = self.em.apply(it.op.fn, ["i"], body)
                self._stores(it, v, stores, packs)
            else:
                assert isinstance(it.op, ir.Reduce)
                tile.titles.append(it.op.name)
                v = self.em.apply(it.op.fn, ["i"], body)
                red = reduction(it.op.op, v, it.op.fn.result.dtype, it.op.dtype, ln, self.names)
                body.lines += red.update
                for acc in red.accs:
                    part = self.names.fresh("part")
                    tile.partials.append(
                        {"ctype": acc.ctype, "name": part, "acc": acc.name, "init": acc.init}
                    )
                    tile.clauses.append(f" reduction({acc.clause}:{acc.name})")
                    tile.finish.append(f"{acc.ctype} {acc.name} = {acc.init};")
                    tile.finish.append(
                        f"for (int k = 0; k < nt; k++) {combine_acc(acc, acc.name, f'{part}[k]')}"
                    )
                var = self.names.get(it.op.name)
                tile.decls.append(f"  {ctype(it.op.dtype)} {var};")
                tile.finish.append(f"{var} = {red.final};")
        body.copy = False
        tile.pre = self.tile_pre(body)
        tile.post = self._tile_post(packs)
        for buf, ptr, canon, _ in self.f16_tiles:
            tile.pre.append(f"float {buf}[HP_TILE];")
            tile.post.append(f"hp_tile_f32_to_f16({buf}, {ptr} + i0, tl, {int(canon)});")
        self.f16_tiles = []
        for buf, _, _ in packs:
            tile.pre.insert(0, f"uint8_t {buf}[HP_TILE];")
        tile.hoist = "".join(f"  {ln}\n" for ln in body.hoist)
        tile.variants = variants(body, body.lines + stores)
        return tile

    def segfused(self, fu: SegFusion) -> str:
        """A segment reduction and its consumer loops, block by block (lower.SegFusion)."""
        op = fu.special.op
        assert isinstance(op, ir.SegReduce) and fu.special.home is not None
        self.hoisted = []
        body, res = self.lambda_body(op.fn, op.length, fu.level)
        red = reduction(op.op, res, op.fn.result.dtype, op.dtype, "(j1 - j0)", self.names)
        seg_tiles = [self.tile_parts(lp) for lp in fu.seg_loops]
        elem_tiles = [self.tile_parts(lp) for lp in fu.elem_loops]
        hoist = "".join(f"  {ln}\n" for ln in self.hoisted)
        hoist += "".join(t.hoist for t in seg_tiles + elem_tiles)
        titles = ", ".join(x for t in seg_tiles + elem_tiles for x in t.titles)
        tpl = self.env.get_template("c_segfused.c.j2")
        return hoist + tpl.render(
            level=fu.level, op=op.op, out_name=op.name, titles=titles,
            length=self.length(op.length), seg=const(fu.seg, op.seg.dtype),
            out_len=self.length(self.plan.arrays[op.name].length),
            out=self.target_ptr(fu.special.home), vt=mtype(op.dtype),
            acc_decls=[f"{a.ctype} {a.name} = {a.init};" for a in red.accs],
            clauses="".join(f" reduction({a.clause}:{a.name})" for a in red.accs),
            body=body, update=list(red.update), final=red.final, seg_tiles=seg_tiles,
            elem_tiles=elem_tiles,
        )  # fmt: skip

    def _stores(
        self, it: Item, v: str, stores: list[str], packs: list[tuple[str, str, int]]
    ) -> None:
        """The statements storing ``v`` to each of ``it``'s targets; packed arrays go through
        a tile buffer (``packs``), packed after the tile loop."""
        if not isinstance(it.op, ir.Map):  # pragma: no cover - store items are maps
            raise TypeError(f"not a map: {it.op.name}")
        t = it.op.type
        for tg in it.targets:
            if t.bits is not None and t.bits < 8:
                buf = self.names.fresh("pk")
                stores.append(f"{buf}[t] = {v};")
                packs.append((buf, self.target_ptr(tg), t.bits))
            else:
                stores.append(self.store(tg, t.dtype, v))

    def tile_pre(self, body: Body) -> list[str]:
        """Per-tile code before a tile loop's body: unpacked arrays, random numbers."""
        pre: list[str] = list(body.tile_pre)
        for name, buf in body.unpacked.items():
            m = self.mem[name]
            assert m.bits is not None
            per = 8 // m.bits
            # 64 values per step where the CPU has AVX-512 VBMI (hp_unpack64), the rest here
            start = f"hp_unpack64({m.ptr} + i0 / {per}, {buf}, tl, {m.bits}) / {per}"
            if m.bits in (1, 2):
                # a table word per byte: one load and one store for 8 or 4 values
                # (hp_unpack<w>); measured faster than shifts for these widths, slower for 4
                pre += [
                    f"uint8_t {buf}[HP_TILE];",
                    f"for (int64_t q = {start}; q < (tl + {per - 1}) / {per}; q++)",
                    f"  memcpy({buf} + {per} * q, &hp_unpack{m.bits}[{m.ptr}[i0 / {per} + q]], {per});",
                ]  # fmt: skip
                continue
            mask = (1 << m.bits) - 1
            parts = " ".join(
                f"{buf}[{per} * q + {j}] = (uint8_t)((b >> {j * m.bits}) & {mask});"
                for j in range(per)
            )
            pre += [
                f"uint8_t {buf}[HP_TILE];",
                f"for (int64_t q = {start}; q < (tl + {per - 1}) / {per}; q++) {{",
                f"  const uint8_t b = {m.ptr}[i0 / {per} + q];",
                f"  {parts}",
                "}",
            ]  # fmt: skip
        for stream, buf in body.rand_tiles.items():
            pre += [
                f"uint32_t {buf}[HP_TILE];",
                f"hp_philox_tile(i0, tl, {stream}u, rk0, rk1, rstep, rtid, {buf});",
            ]
        return pre

    def _tile_post(self, packs: list[tuple[str, str, int]]) -> list[str]:
        return [ln for buf, ptr, bits in packs for ln in pack_lines(buf, ptr, bits)]


def _balanced(call: str) -> bool:
    """Whether the outer parentheses of ``f(...)`` enclose the whole argument list."""
    depth = 0
    for k, ch in enumerate(call):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and ch == ")":
            return k == len(call) - 1
    return False


__all__ = ["MAXT", "PAR_MIN", "TILE", "CFunction"]
