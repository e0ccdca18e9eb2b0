"""The C-family renderer: what the C (OpenMP) and CUDA targets share for one plan.

:class:`CFamily` holds one function's state (names, lengths, pointers, workspace, setup lines)
and forms what every target writes alike: arguments, state and payload pointers, payload
scalars, custom reductions, and stores by a table of rules (:attr:`CFamily.STORES`, tried in
order). A target subclasses it with its layout (:class:`~hipress.compll.backends.c.render.CFunction`:
OpenMP tile loops; :class:`~hipress.compll.backends.cuda.render.CudaFunction`: kernels) and
overrides entries of the tables.
"""

from __future__ import annotations

from collections.abc import Callable

from jinja2 import Environment

from hipress.compll.backends.cfamily.body import Body, Mem
from hipress.compll.backends.cfamily.expr import Emitter
from hipress.compll.backends.cfamily.syntax import Names, ctype, mtype
from hipress.compll.ir import nodes as ir
from hipress.compll.ir.types import I64, ArrayType, DType
from hipress.compll.lower.kernel_plan import Destination, KernelPlan
from hipress.compll.lower.sparse import SparseDecode

# (function, target, element type, pointer, value) -> the store statement, or None: not this rule
StoreRule = Callable[["CFamily", Destination, DType, str, str], "str | None"]


def store_outacc(f: CFamily, tg: Destination, dt: DType, ptr: str, v: str) -> str | None:
    return f"out[i] = out[i] + {f.scaled(v)};" if tg.kind == "outacc" else None


def store_out_tile(f: CFamily, tg: Destination, dt: DType, ptr: str, v: str) -> str | None:
    return f"out[i] = {f.scaled(v)};" if tg.kind == "out" and f.tile else None


def store_bool(f: CFamily, tg: Destination, dt: DType, ptr: str, v: str) -> str | None:
    return f"{ptr}[i] = (uint8_t)({v});" if dt.is_bool else None


def store_payload_float(f: CFamily, tg: Destination, dt: DType, ptr: str, v: str) -> str | None:
    # payload floats are stored canonically (one NaN)
    return f"{ptr}[i] = hp_canon_{dt.name}({v});" if tg.kind == "payload" and dt.is_float else None


def store_plain(f: CFamily, tg: Destination, dt: DType, ptr: str, v: str) -> str | None:
    return f"{ptr}[i] = {v};"


STORES: tuple[StoreRule, ...] = (
    store_outacc,
    store_out_tile,
    store_bool,
    store_payload_float,
    store_plain,
)


def tileable(plan: KernelPlan) -> bool:
    """Whether ``plan`` is a decode that is one plain map over the output (one loop of stores,
    no reduction, special stage or workspace): then any tile of the output can be decoded on
    its own (a :class:`CFamily` with ``tile=True``), which ``hp_decode_sum`` uses."""
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


class CFamily:
    """One plan (encode, decode or decode-accumulate) of a C-family target, as function
    ``name``; with ``tile`` (a :func:`tileable` decode), a function of one tile of the output
    that takes ``pay``, ``out`` and ``hp_d`` as parameters and divides each value it stores or
    adds by ``hp_d``."""

    reports_nonfinite = True  # hp_enc_args.nonfinite (hipress/compll/lower/finite.py)
    STORES: tuple[StoreRule, ...] = STORES
    EMITTER: type[Emitter] = Emitter

    def __init__(
        self, env: Environment, prog: ir.Program, plan: KernelPlan, name: str, tile: bool = False
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
        self.ws_sizes: list[object] = []  # (IR length, element bytes) or a target's own entry
        self.ws_ptr: dict[str, str] = {}
        self.em = self.EMITTER(plan, self.names, self.mem, self.lengths, self.length)
        self.safe_lines: list[str] = []
        self.hoisted: list[str] = []  # host code of the stage being rendered
        self.offsets: list[tuple[str, str]] = []  # payload fields: (offset var, byte size)

    # -- lengths and pointers

    def length(self, e: ir.Expr) -> str:
        """The C variable holding array length ``e`` (declared in :attr:`length_lines` the
        first time)."""
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

    def target_ptr(self, t: Destination) -> str:
        """The C pointer stores to ``t`` go through."""
        if t.kind == "ws":
            return self.ws_ptr[t.name]
        if t.kind == "state":
            return self.names.get(t.name, "st")
        if t.kind == "payload":
            return self.names.get(t.name, "f")
        return "out"

    def scratch(self, ctype_: str, count: str, size: object = None) -> str:
        """A workspace buffer of ``count`` elements (an expression of length vars); ``size`` is
        the same as (IR length or int, element bytes), or a target's own entry, for targets
        that lay out the workspace on the host."""
        var = self.names.fresh("scr")
        self.ws.append(f"({count}) * (int64_t)sizeof({ctype_})")
        self.ws_sizes.append(size)
        self.setup.append(f"{ctype_}* const {var} = ({ctype_}*)wsp[{len(self.ws) - 1}];")
        return var

    def arrays(self) -> None:
        """Declare the workspace arrays and the read pointers of every stored array."""
        plan = self.plan
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

    def payload(self, writing: bool) -> None:
        """The payload field pointers and offsets (``writing``: an encode, which also zeroes
        the padding between fields); reads of scalar fields for a decode."""
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

    def inputs(self) -> None:
        """Setup lines: the function's arguments, state and payload."""
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
            self.payload(writing=True)
        else:
            if not self.tile:  # (a tile function takes them as parameters)
                self.setup += [
                    "const uint8_t* const pay = a->payload;",
                    "float* const out = a->out;",
                ]
            self.payload(writing=False)

    def sparse_fields(self, sd: SparseDecode, qualifier: str = "static inline") -> str:
        """``hp_sparse_fields``: a payload's index and value arrays and how many are sent, for
        a sparse decode (:mod:`hipress.compll.lower.sparse`); ``qualifier``: of the function (CUDA:
        a device function)."""
        self.payload(writing=False)
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

    def finish(self) -> None:
        """The encode's last lines (``final``): payload scalars, the NaN/Inf flag, scalar
        state."""
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

    def store(self, tg: Destination, dt: DType, v: str) -> str:
        """The statement storing value ``v`` (element type ``dt``) at ``[i]`` of ``tg``: the
        first of :attr:`STORES` that applies."""
        ptr = self.target_ptr(tg)
        for rule in self.STORES:
            line = rule(self, tg, dt, ptr, v)
            if line is not None:
                return line
        raise ValueError(f"no store rule for {tg} of {dt}")  # pragma: no cover - store_plain

    def scaled(self, v: str) -> str:
        """A decoded value as this function stores it (a tile function: divided by ``hp_d``)."""
        return f"({v}) / hp_d" if self.tile else v

    def lambda_body(
        self, fn: ir.Lambda, length: ir.Expr | None, level: int, idx: str = "j"
    ) -> tuple[list[str], str]:
        """The statements and result of ``fn`` at index ``idx`` of a loop of ``length`` (its
        host code goes to :attr:`hoisted`)."""
        body = Body(level=level, index=idx, loop_len=length)
        v = self.em.apply(fn, [idx], body)
        self.hoisted += body.hoist
        return body.lines, v

    def custom_reduce(self, op: ir.Reduce, lv: int, shown_level: int) -> str:
        """A custom reduction (a pairwise tree, as the reference), declaring its variable;
        ``shown_level``: the level its comment names."""
        assert op.combine is not None and op.init is not None
        body, res = self.lambda_body(op.fn, op.length, lv)
        ib = Body(level=lv)
        init = self.em.expr(op.init, ib, {})
        cb = Body(level=lv)
        cres = self.em.apply(op.combine, ["ca", "cb"], cb)
        dt = op.dtype
        ln = self.length(op.length)
        var = self.names.get(op.name)
        return f"  {ctype(dt)} {var};\n" + self.env.get_template("c_custom_reduce.c.j2").render(
            level=shown_level, name=var, length=ln, vt=ctype(dt),
            scratch_a=self.scratch(ctype(dt), ln, (op.length, 8)),
            scratch_b=self.scratch(ctype(dt), f"({ln} + 1) / 2", (op.length, 8)),
            init_body=ib.lines, init=init, body=body, result=res, combine_body=cb.lines,
            combine_result=cres,
        )  # fmt: skip
