"""Plan -> C source (OpenMP, vectorisable tile loops). Used by :mod:`hipress.compll.render`.

Python decides what each loop computes and forms the statements; the templates
(``templates/c_*.j2``) hold the layout of the file, the functions, the loops and the special
stages.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import jinja2

from hipress.compll import ir
from hipress.compll.plan import (
    Item,
    Loop,
    Plan,
    SegFusion,
    Target,
)
from hipress.compll.render_expr import (
    Body,
    Emitter,
    Mem,
    Names,
    const,
    ctype,
    mtype,
    variants,
)
from hipress.compll.render_reduce import combine_acc, reduction
from hipress.compll.render_stages import Stages
from hipress.compll.sparse import SparseDecode
from hipress.compll.types import I64, ArrayType, DType
from hipress.compll.walk import walk


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


# ---------------------------------------------------------------- one function


def tileable(plan: Plan) -> bool:
    """Whether ``plan`` is a decode that is one plain map over the output (one loop of stores,
    no reduction, special stage or workspace): then any tile of the output can be decoded on
    its own (:meth:`CFunction.render` with ``tile=True``), which ``hp_decode_sum`` uses."""
    loops = [lp for st in plan.steps for lp in st.loops]
    return (
        plan.fn == "decode"
        and not plan.ws
        and not plan.fusions
        and not any(st.specials for st in plan.steps)
        and len(loops) == 1
        and loops[0].length == ir.Ref(ir.N, I64)
        and all(it.kind == "store" for it in loops[0].items)
    )


class CFunction(Stages):
    """Renders one plan (encode, decode or decode-accumulate) as a C function; with ``tile``
    (a :func:`tileable` decode only), as a serial function of one tile of the output, taking
    ``pay``, ``out``, ``n``, ``i0``, ``tl`` and ``hp_d``, by which it divides each value it
    stores or adds (``hp_decode_sum``: every decode divided before the sum)."""

    reports_nonfinite = True  # hp_enc_args.nonfinite (hipress/compll/finite.py)

    def __init__(
        self, env: jinja2.Environment, prog: ir.Program, plan: Plan, name: str, tile: bool = False
    ) -> None:
        if tile and not tileable(plan):
            raise ValueError(f"{name}: only a decode that is one map over the output tiles")
        self.tile = tile
        self.env = env
        self.prog = prog
        self.plan = plan
        self.name = name
        self.names = Names()
        self.lengths: dict[str, str] = {}
        self.length_lines: list[str] = []
        self.mem: dict[str, Mem] = {}
        self.setup: list[str] = []
        self.final: list[str] = []
        self.ws: list[str] = []  # byte-size expressions, in layout order
        self.ws_sizes: list[tuple[object, int] | None] = []
        self.ws_ptr: dict[str, str] = {}
        self.em = Emitter(plan, self.names, self.mem, self.lengths, self.length)
        self.scalar_decl: set[str] = set()
        self.safe_lines: list[str] = []
        self.hoisted: list[str] = []
        self.f16_tiles: list[tuple[str, str, bool, str]] = []

    # -- lengths and pointers

    def length(self, e: ir.Expr) -> str:
        key = repr(e)
        if key not in self.lengths:
            var = f"L{len(self.lengths) + 1}"
            self.lengths[key] = var
            body = Body()
            code = self.em.expr(e, body, {})
            if body.lines:  # pragma: no cover - lengths depend on n and constants only
                raise ValueError(f"array length {ir.show_expr(e)} is not a host expression")
            self.length_lines.append(f"const int64_t {var} = hp_len({code});")
        return self.lengths[key]

    def target_ptr(self, t: Target) -> str:
        if t.kind == "ws":
            return self.ws_ptr[t.name]
        if t.kind == "state":
            return self.names.get(t.name, "st")
        if t.kind == "payload":
            return self.names.get(t.name, "f")
        return "out"

    def scratch(self, ctype_: str, count: str, size: tuple[object, int] | None = None) -> str:
        """A workspace buffer of ``count`` elements (an expression of length vars); ``size`` is
        the same as (IR length or int, element bytes), for targets that lay out on the host."""
        var = self.names.fresh("scr")
        self.ws.append(f"({count}) * (int64_t)sizeof({ctype_})")
        self.ws_sizes.append(size)
        self.setup.append(f"{ctype_}* const {var} = ({ctype_}*)wsp[{len(self.ws) - 1}];")
        return var

    def _arrays(self) -> None:
        plan, prog = self.plan, self.prog
        for a in plan.arrays.values():
            self.length(a.length)
        for name, t in plan.homes.items():
            a = plan.arrays[name]
            if t.kind == "ws":
                var = self.names.get(name, "w")
                self.ws_ptr[name] = var
                nbytes = (
                    f"({self.length(a.length)} * {a.bits} + 7) / 8"
                    if a.bits is not None
                    else f"{self.length(a.length)} * (int64_t)sizeof({mtype(a.dtype)})"
                )
                self.ws.append(nbytes)
                self.ws_sizes.append((a.length, -a.bits if a.bits is not None else a.dtype.nbytes))
                self.setup.append(
                    f"{mtype(a.dtype)}* const {var} = ({mtype(a.dtype)}*)wsp[{len(self.ws) - 1}];"
                )
        for name, a in plan.arrays.items():
            if a.origin == "grad":
                ptr = "s_grad"
            elif a.origin == "state":
                ptr = self.names.get(name, "st")
            elif a.origin == "payload":
                ptr = self.names.get(name.split(".", 1)[1], "f")
            elif name in plan.homes:
                ptr = self.target_ptr(plan.homes[name])
            else:
                continue
            ln = self.length(a.length)
            mt = "uint8_t" if a.bits is not None else mtype(a.dtype)
            safe = self.names.get(name, "rp")
            self.safe_lines.append(
                f"const {mt}* const {safe} = {ln} > 0 ? (const {mt}*){ptr} : (const {mt}*)hp_zeros;"
            )
            self.mem[name] = Mem(ptr, ln, a.dtype, a.bits, safe)
        del prog

    def _payload(self, writing: bool) -> None:
        prog = self.prog
        q = "" if writing else "const "
        prev = None
        offs = []
        for k, f in enumerate(prog.payload):
            off = f"po{k}"
            if prev is None:
                self.setup.append(f"const int64_t {off} = 0;")
            else:
                self.setup.append(f"const int64_t {off} = hp_up8({prev[0]} + {prev[1]});")
            if isinstance(f.type, ArrayType):
                ln = self.length(f.type.length)
                nb = (
                    f"({ln} * {f.type.bits} + 7) / 8"
                    if f.type.bits
                    else f"{ln} * {f.type.dtype.nbytes}"
                )
                mt = mtype(f.type.dtype)
                self.setup.append(
                    f"{q}{mt}* const {self.names.get(f.name, 'f')} = ({q}{mt}*)(pay + {off});"
                )
            else:
                nb = str(f.type.nbytes)
                if not writing:
                    var = self.names.get(f"{prog.decode.payload}.{f.name}")
                    if f.type.is_bool:
                        self.setup.append(f"const bool {var} = pay[{off}] != 0;")
                    else:
                        self.setup.append(f"{ctype(f.type)} {var};")
                        self.setup.append(f"memcpy(&{var}, pay + {off}, {f.type.nbytes});")
            offs.append((off, nb))
            prev = (off, f"({nb})")
        if writing:
            total = f"hp_up8({prev[0]} + {prev[1]})" if prev else "0"
            for k, (off, nb) in enumerate(offs):
                end = offs[k + 1][0] if k + 1 < len(offs) else total
                self.setup.append(
                    f"memset(pay + {off} + ({nb}), 0, (size_t)({end} - {off} - ({nb})));"
                )
            self.offsets = offs

    def _inputs(self) -> None:
        prog = self.prog
        if self.plan.fn == "encode":
            self.setup += [
                "const uint32_t rk0 = (uint32_t)a->seed, rk1 = (uint32_t)(a->seed >> 32);",
                "const uint32_t rstep = (uint32_t)a->step, rtid = (uint32_t)a->tensor_id;",
                "(void)rk0; (void)rk1; (void)rstep; (void)rtid;",
                "const float* const s_grad = a->grad;",
                "uint8_t* const pay = a->out;",
            ]
            for k, s in enumerate(prog.state):
                if isinstance(s.type, ArrayType):
                    mt = mtype(s.type.dtype)
                    self.setup.append(
                        f"{mt}* const {self.names.get(s.name, 'st')} = ({mt}*)a->state[{k}];"
                    )
                elif s.type.is_bool:
                    self.setup.append(
                        f"const bool {self.names.get(s.name)} = *(const uint8_t*)a->state[{k}] != 0;"
                    )
                else:
                    t = ctype(s.type)
                    self.setup.append(
                        f"const {t} {self.names.get(s.name)} = *(const {t}*)a->state[{k}];"
                    )
            self._payload(writing=True)
        else:
            if not self.tile:  # (a tile function takes them as parameters)
                self.setup += [
                    "const uint8_t* const pay = a->payload;",
                    "float* const out = a->out;",
                ]
            self._payload(writing=False)

    def render_sparse_fields(self, sd: SparseDecode, qualifier: str = "static inline") -> str:
        """``hp_sparse_fields``: a payload's index and value arrays and how many are sent, for
        a sparse decode (:mod:`hipress.compll.sparse`); ``qualifier``: of the function (CUDA:
        a device function)."""
        self._payload(writing=False)
        length = self.length(sd.length)
        body = Body()
        count = self.em.expr(sd.count, body, {})
        if body.lines:  # pragma: no cover - a payload scalar or a host expression of n
            raise ValueError(f"sparse count {ir.show_expr(sd.count)} is not a host expression")
        return self.env.get_template("c_sparse_fields.c.j2").render(
            title=f"{self.prog.name}: {self.name}",
            qualifier=qualifier,
            setup=[*self.length_lines, *self.setup, "(void)n;"],
            count=count,
            length=length,
            idx=self.names.get(sd.idx, "f"),
            val=self.names.get(sd.val, "f"),
        )

    # -- stages

    def render(self) -> str:
        self._inputs()
        self._arrays()
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
            self._final()
        if self.tile:
            return self.env.get_template("c_tile_function.c.j2").render(
                title=f"{self.prog.name}: {self.name}",
                name=self.name,
                setup=self.length_lines + self.setup + self.safe_lines,
                stages=stages,
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

    def _final(self) -> None:
        prog = self.prog
        for (off, _), f, v in zip(self.offsets, prog.payload, prog.encode.fields, strict=True):
            if isinstance(v, str):
                continue
            body = Body(level=10**6)
            x = self.em.expr(v, body, {})
            assert isinstance(f.type, DType)
            self.final += body.lines
            var = self.names.fresh("fv")
            t = mtype(f.type)
            if f.type.is_float:
                x = f"hp_canon_{f.type.name}({x})"
            self.final.append(
                f"{{ const {t} {var} = ({t})({x}); memcpy(pay + {off}, &{var}, {f.type.nbytes}); }}"
            )
        if self.reports_nonfinite:
            flag = self.names.get(self.plan.nonfinite) if self.plan.nonfinite else "2"
            self.final.append(f"if (a->nonfinite) *a->nonfinite = (uint8_t)({flag});")
        for s in self.plan.final_state:
            k = next(i for i, sl in enumerate(prog.state) if sl.name == s.state)
            slot = prog.state[k]
            assert isinstance(slot.type, DType) and not isinstance(s.value, str)
            body = Body(level=10**6)
            x = self.em.expr(s.value, body, {})
            self.final += body.lines
            t = mtype(slot.type)
            self.final.append(f"*({t}*)a->state[{k}] = ({t})({x});")

    def _declare_scalar(self, name: str, dt: DType) -> str:
        var = self.names.get(name)
        return f"  {ctype(dt)} {var};"

    def loop(self, lp: Loop) -> str:
        tile = self._tile(lp)
        if self.tile:
            text = self.env.get_template("c_tile_stage.c.j2").render(
                level=lp.level, title=", ".join(tile.titles), pre=tile.pre, clauses="",
                variants=tile.variants, post=tile.post,
            )  # fmt: skip
            return tile.hoist + text
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
            if not (isinstance(it.op, ir.Reduce) and it.op.op in ("any", "count")):
                break
            guard = self._guard(it.op.fn, lp.level)
            if guard is None:
                break
            guards.append(guard)
            empty = "false" if it.op.op == "any" else "INT64_C(0)"
            empties.append(f"    {self.names.get(it.op.name)} = {empty};\n")
        else:
            cond = " || ".join(f"({g})" for g in guards)
            text = f"  if ({cond}) {{\n{text}\n  }} else {{\n{''.join(empties)}  }}"
        return "\n".join([*tile.decls, text])

    def _guard(self, fn: ir.Lambda, level: int) -> str | None:
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

    def _tile(self, lp: Loop) -> Tile:
        """The parts of ``lp``'s tile loop: per-tile code before and after, the body variants,
        reduction partials, and host code to run before the loop."""
        ln = self.length(lp.length)
        body = Body(level=lp.level, index="i", loop_len=lp.length, fuse=True, tile="t")
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
        tile.pre = self._tile_pre(body)
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
        body, res = self._lambda(op.fn, op.length, fu.level)
        red = reduction(op.op, res, op.fn.result.dtype, op.dtype, "(j1 - j0)", self.names)
        seg_tiles = [self._tile(lp) for lp in fu.seg_loops]
        elem_tiles = [self._tile(lp) for lp in fu.elem_loops]
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
        assert isinstance(it.op, ir.Map)
        t = it.op.type
        for tg in it.targets:
            ptr = self.target_ptr(tg)
            if t.bits is not None and t.bits < 8:
                buf = self.names.fresh("pk")
                stores.append(f"{buf}[t] = {v};")
                packs.append((buf, ptr, t.bits))
            elif tg.kind == "outacc":
                stores.append(f"out[i] = out[i] + {self._scaled(v)};")
            elif tg.kind == "out" and self.tile:
                stores.append(f"out[i] = {self._scaled(v)};")
            elif t.dtype.is_bool:
                stores.append(f"{ptr}[i] = (uint8_t)({v});")
            elif t.dtype.name == "f16" and v.startswith("hp_f32_to_f16(") and _balanced(v):
                # collect the f32 values of the tile, convert them with F16C afterwards
                buf = self.names.fresh("cv")
                stores.append(f"{buf}[t] = {v[len('hp_f32_to_f16(') : -1]};")
                self.f16_tiles.append((buf, ptr, tg.kind == "payload", v))
            elif tg.kind == "payload" and t.dtype.is_float:
                stores.append(f"{ptr}[i] = hp_canon_{t.dtype.name}({v});")
            else:
                stores.append(f"{ptr}[i] = {v};")

    def _scaled(self, v: str) -> str:
        """A decoded value as a tile function stores it: divided by ``hp_d``."""
        return f"({v}) / hp_d" if self.tile else v

    def _tile_pre(self, body: Body) -> list[str]:
        pre: list[str] = list(body.tile_pre)
        for name, buf in body.unpacked.items():
            m = self.mem[name]
            assert m.bits is not None
            per = 8 // m.bits
            if m.bits in (1, 2):
                # a table word per byte: one load and one store for 8 or 4 values
                # (hp_unpack<w>); measured faster than shifts for these widths, slower for 4
                pre += [
                    f"uint8_t {buf}[HP_TILE];",
                    f"for (int64_t q = 0; q < (tl + {per - 1}) / {per}; q++)",
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
                f"for (int64_t q = 0; q < (tl + {per - 1}) / {per}; q++) {{",
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
        post: list[str] = []
        for buf, ptr, bits in packs:
            per = 8 // bits
            expr = " | ".join(f"({buf}[{per} * q + {j}] << {j * bits})" for j in range(per))
            post += [
                f"for (int64_t t = tl; t < (tl + {per - 1}) / {per} * {per}; t++) {buf}[t] = 0;",
                "#pragma omp simd",
                f"for (int64_t q = 0; q < (tl + {per - 1}) / {per}; q++) {ptr}[i0 / {per} + q] = (uint8_t)({expr});",
            ]  # fmt: skip
        return post


def _balanced(call: str) -> bool:
    """Whether the outer parentheses of ``f(...)`` enclose the whole argument list."""
    depth = 0
    for k, ch in enumerate(call):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and ch == ")":
            return k == len(call) - 1
    return False
