"""Stage: IR -> kernel plan. Decides which loops run, what each computes and where arrays live.

The plan is shared by every native target (C and CUDA render the same plan). Rules:

- A ``map`` is *virtual* (never stored; its lambda is inlined wherever it is read, at any index)
  unless it is a sink (payload field, new state, decode result) or it is expensive (random
  numbers, divisions) and read from more than one place or at another index.
- Work is grouped into *levels*. A loop item (a stored map or a standard reduction) runs at the
  first level where everything it reads is ready; items of one level and one length fuse into one
  parallel loop. A map read at ``[i]`` by an item of its own loop is taken from registers.
  Filter, topk, sort, scan, segreduce, scatter and custom reductions are stages of their own.
- Host scalars (``let``) are computed between levels, as soon as their inputs are ready.
- A stored map that a filter over its own length reads at the filter's index (``[j]``, or
  rotated, ``[(j + h) % n]``), and that is elementwise in its inputs, is *deferred* to the
  filter: it is stored at the filter's level, in a loop of its own that a target may run inside
  the filter's pass (:class:`FilterFusion`); readers before that level recompute it.
- A new state array is written in place when no later reader needs the old values; otherwise it
  goes to the workspace and is copied at the end.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from hipress.compll import ir
from hipress.compll.plan import (
    CHEAP,
    Array,
    FilterFusion,
    Item,
    Loop,
    Plan,
    ScatterAdd,
    Special,
    Step,
    Target,
    inline,
)
from hipress.compll.types import F32, I32, I64, ArrayType
from hipress.compll.walk import lambda_exprs, op_exprs, op_lambdas, walk

if TYPE_CHECKING:
    from hipress.compll.defer import Deferral

_GATHER = 25  # cost of a read from memory at an index that does not move with the loop


def _streamed(index: ir.Expr, param: str | None) -> bool:
    """Whether reads at ``index`` move through memory with the loop: ``[i]``, segment reads
    ``[i / d]`` and rotated reads ``[(i + h) % len]`` (the C target buffers or unswitches the
    latter two per tile); other indices are gathers."""
    if isinstance(index, ir.Ref):
        return index.name == param
    if isinstance(index, ir.Binary) and index.op in ("div", "mod"):
        a = index.a
        if index.op == "mod" and isinstance(a, ir.Binary) and a.op == "add":
            return any(isinstance(t, ir.Ref) and t.name == param for t in (a.a, a.b))
        return isinstance(a, ir.Ref) and a.name == param
    return False


def _cost_expr(e: ir.Expr) -> int:
    c = 0
    for x in walk(e):
        c += 1
        if isinstance(x, ir.Rand):
            c += 50
        elif isinstance(x, ir.Binary) and x.op in ("div", "mod") and not x.dtype.is_float:
            c += 10
        elif (isinstance(x, ir.Binary) and x.op == "mod") or (
            isinstance(x, ir.Unary) and x.op == "sqrt"
        ):
            c += 5
    return c


# ---------------------------------------------------------------- the planner


class _Planner:
    def __init__(self, prog: ir.Program, fn: str, accumulate: bool) -> None:
        self.prog = prog
        self.fn = fn
        self.accumulate = accumulate
        self.ops = prog.encode.ops if fn == "encode" else prog.decode.ops
        self.arrays: dict[str, Array] = {}
        self.maps: dict[str, ir.Map] = {}
        self.scalar_ready: dict[str, int] = {}
        self.levels: dict[str, int] = {}
        self.homes: dict[str, Target] = {}
        self.cost: dict[str, int] = {}
        # deferred maps: filter op index, and the filter's index of its read
        self.pending: dict[str, Deferral] = {}  # not placed yet (read as if virtual)
        self.deferred: dict[str, Deferral] = {}  # placed at their filter's level
        self.read_at: dict[str, int] = {}  # pending map -> the last level that read it
        self._inputs()
        self._declare_ops()

    # -- arrays

    def _inputs(self) -> None:
        p = self.prog
        if self.fn == "encode":
            self.arrays[p.encode.grad] = Array(p.encode.grad, F32, ir.Ref(ir.N, I64), None, "grad")
            for s in p.state:
                if isinstance(s.type, ArrayType):
                    t = s.type
                    self.arrays[s.name] = Array(s.name, t.dtype, t.length, t.bits, "state")
        else:
            for f in p.payload:
                if isinstance(f.type, ArrayType):
                    nm = f"{p.decode.payload}.{f.name}"
                    t = f.type
                    self.arrays[nm] = Array(nm, t.dtype, t.length, t.bits, "payload")

    def _declare_ops(self) -> None:
        for op in self.ops:
            if isinstance(op, ir.Map):
                t = op.type
                self.arrays[op.name] = Array(op.name, t.dtype, t.length, t.bits, "map")
                self.maps[op.name] = op
            elif isinstance(op, ir.Filter | ir.TopK):
                self.arrays[op.idx] = Array(op.idx, I32, _bound(op), None, "op")
            elif isinstance(op, ir.Sort | ir.Scan | ir.Scatter):
                self.arrays[op.name] = Array(op.name, op.dtype, op.length, None, "op")
            elif isinstance(op, ir.SegReduce):
                self.arrays[op.name] = Array(op.name, op.dtype, _nseg(op), None, "op")
        for name, m in self.maps.items():
            self.cost[name] = self._lambda_cost(m.fn, set())
            del name

    def _lambda_cost(self, fn: ir.Lambda, seen: set[str], gathered: bool = False) -> int:
        """Cost of evaluating ``fn`` once, inlined maps included; ``gathered``: ``fn`` runs at
        an index that is not its loop's own, so its reads from memory are gathers."""
        c = 0
        param = fn.params[0].name if fn.params else None
        for e in lambda_exprs(fn):
            c += _cost_expr(e)
            for x in walk(e):
                if not isinstance(x, ir.Load):
                    continue
                at = not gathered and _streamed(x.index, param)
                if x.array in self.maps:
                    if x.array not in seen:
                        c += self._lambda_cost(self.maps[x.array].fn, seen | {x.array}, not at)
                elif not at:
                    c += _GATHER
        return c

    # -- which maps must be stored

    def _sinks(self) -> dict[str, list[Target]]:
        sinks: dict[str, list[Target]] = {}
        p = self.prog
        if self.fn == "encode":
            for f, v in zip(p.payload, p.encode.fields, strict=True):
                if isinstance(v, str):
                    sinks.setdefault(v, []).append(Target("payload", f.name))
            for op in self.ops:
                if isinstance(op, ir.StoreState) and isinstance(op.value, str):
                    sinks.setdefault(op.value, []).append(Target("state", op.state))
        else:
            kind = "outacc" if self.accumulate else "out"
            sinks.setdefault(p.decode.result, []).append(Target(kind, "out"))
        return sinks

    def _uses(self) -> dict[str, list[tuple[int, bool]]]:
        """For each map: (consumer op index, aligned) for every read."""
        uses: dict[str, list[tuple[int, bool]]] = {}
        for k, op in enumerate(self.ops):
            for fn in op_lambdas(op):
                param = fn.params[0].name if fn.params else None
                for e in lambda_exprs(fn):
                    for x in walk(e):
                        if isinstance(x, ir.Load) and x.array in self.maps:
                            al = isinstance(x.index, ir.Ref) and x.index.name == param
                            uses.setdefault(x.array, []).append((k, al))
            for e in op_exprs(op):
                for x in walk(e):
                    if isinstance(x, ir.Load) and x.array in self.maps:
                        uses.setdefault(x.array, []).append((k, False))
            if isinstance(op, ir.Scatter):
                for nm in (op.base, op.idx, op.vals):
                    if nm in self.maps:
                        uses.setdefault(nm, []).append((k, False))
        return uses

    # -- levels

    def _ready_expr(self, e: ir.Expr, loop_len: ir.Expr | None, param: str | None) -> int:
        """Level after which everything ``e`` reads exists, for a consumer in a loop of
        ``loop_len`` whose index is ``param`` (aligned map reads may fuse: they count one
        lower)."""
        r = 0
        for x in walk(e):
            if isinstance(x, ir.Ref):
                r = max(r, self.scalar_ready.get(x.name, 0))
            elif isinstance(x, ir.Load):
                r = max(r, self._ready_load(x, loop_len, param))
        return r

    def _ready_load(self, x: ir.Load, loop_len: ir.Expr | None, param: str | None) -> int:
        a = self.arrays[x.array]
        if a.origin in ("grad", "state", "payload"):
            return 0
        aligned = (
            param is not None
            and isinstance(x.index, ir.Ref)
            and x.index.name == param
            and a.length == loop_len
        )
        if a.name in self.maps and (a.name not in self.homes or a.name in self.pending):
            m = self.maps[a.name]  # virtual (or deferred, before its filter): its inputs
            inner = m.fn.params[0].name if aligned else None
            return max(self._ready_expr(e, loop_len, inner) for e in lambda_exprs(m.fn))
        lv = self.levels[a.name]
        if a.name in self.maps and aligned and a.name not in self.deferred:
            return lv - 1  # can fuse into the same loop
        return lv

    def _ready_lambda(self, fn: ir.Lambda, loop_len: ir.Expr | None) -> int:
        param = fn.params[0].name if fn.params else None
        return max(self._ready_expr(e, loop_len, param) for e in lambda_exprs(fn))

    def plan(self) -> Plan:
        sinks = self._sinks()
        uses = self._uses()
        for name, m in self.maps.items():
            us = uses.get(name, [])
            expensive = self.cost[name] > CHEAP
            many = len({k for k, _ in us}) > 1 or any(not al for _, al in us)
            if name in sinks or (expensive and many):
                self.homes[name] = Target("ws", name)
            del m
        from hipress.compll.defer import deferrable

        self.pending = deferrable(self, sinks, uses)

        loop_items: list[tuple[int, Item]] = []  # (level, item)
        specials: list[Special] = []
        lets: list[tuple[int, ir.Let]] = []
        stores: list[ir.StoreState] = []
        for k, op in enumerate(self.ops):
            lv = 0  # the op's level, for _reads_pending
            if isinstance(op, ir.Let):
                lv = self._ready_expr(op.value, None, None)
                self.scalar_ready[op.name] = lv
                lets.append((lv, op))
            elif isinstance(op, ir.Map):
                if op.name not in self.homes or op.name in self.pending:
                    continue  # virtual, or placed with its filter
                lv = max(1, self._ready_lambda(op.fn, op.type.length) + 1)
                self.levels[op.name] = lv
                loop_items.append((lv, Item("store", op)))
            elif isinstance(op, ir.Reduce):
                lv = max(1, self._ready_lambda(op.fn, op.length) + 1)
                hostr = self._ready_expr(op.length, None, None)
                if op.init is not None:
                    hostr = max(hostr, self._ready_expr(op.init, None, None))
                lv = max(lv, hostr + 1)
                if op.op == "custom":
                    assert op.combine is not None
                    lv = max(lv, self._ready_lambda(op.combine, None) + 1)
                    specials.append(Special(lv, op, None))
                else:
                    loop_items.append((lv, Item("reduce", op)))
                self.scalar_ready[op.name] = lv
            elif isinstance(op, ir.Scatter):
                self.homes[op.name] = Target("ws", op.name)
                base = (
                    ir.Load(op.base, ir.Ref("__j", I64), op.dtype)
                    if op.base is not None
                    else ir.Const(0, op.dtype)
                )
                init = ir.Map(
                    op.name,
                    ArrayType(op.dtype, op.length),
                    ir.Lambda((ir.Ref("__j", I64),), (), base),
                )
                li = max(1, self._ready_lambda(init.fn, op.length) + 1)
                la = li + 1
                for nm in (op.idx, op.vals):
                    la = max(
                        la, self._ready_load(ir.Load(nm, ir.Const(0, I64), I64), None, None) + 1
                    )
                la = max(la, self._ready_expr(op.count, None, None) + 1)
                loop_items.append((li, Item("store", init)))
                specials.append(Special(la, ScatterAdd(op), None))
                self.levels[op.name] = lv = la
            elif isinstance(op, ir.StoreState):
                stores.append(op)
            else:
                lv = 1
                for fn in op_lambdas(op):
                    lv = max(lv, self._ready_lambda(fn, None) + 1)
                for e in op_exprs(op):
                    lv = max(lv, self._ready_expr(e, None, None) + 1)
                # after everything that read its deferred maps (they are stored at its level)
                for x, d in self.pending.items():
                    if d.filter == k:
                        lv = max(lv, self.read_at.get(x, 0) + 1)
                specials.append(Special(lv, op, None))
                if isinstance(op, ir.Filter | ir.TopK):
                    self.homes[op.idx] = Target("ws", op.idx)
                    self.levels[op.idx] = lv
                    self.scalar_ready[op.count] = lv
                    for name in [x for x, d in self.pending.items() if d.filter == k]:
                        self.deferred[name] = self.pending.pop(name)
                        self.levels[name] = lv
                        loop_items.append((lv, Item("store", self.maps[name])))
                else:
                    self.homes[op.name] = Target("ws", op.name)  # type: ignore[union-attr]
                    self.levels[op.name] = lv  # type: ignore[union-attr]
            if self.pending:
                for x in self._reads_pending(op):
                    self.read_at[x] = max(self.read_at.get(x, 0), lv)
        return self._assemble(sinks, loop_items, specials, lets, stores)

    def _filter_of(self, name: str) -> int | None:
        """The op index of the filter a deferred map is stored with (None if not deferred)."""
        d = self.deferred.get(name)
        return None if d is None else d.filter

    def _reads_pending(self, op: ir.Op) -> set[str]:
        """The maps waiting for their filter that ``op`` reads (through inlined maps)."""
        out: set[str] = set()
        todo = [e for fn in op_lambdas(op) for e in lambda_exprs(fn)] + list(op_exprs(op))
        names = [op.base, op.idx, op.vals] if isinstance(op, ir.Scatter) else []
        seen: set[str] = set()
        while todo or names:
            if names:
                nm = names.pop()
            else:
                loads = [x.array for x in walk(todo.pop()) if isinstance(x, ir.Load)]
                names += loads
                continue
            if nm is None or nm in seen:
                continue
            seen.add(nm)
            if nm in self.pending:
                out.add(nm)
            if nm in self.maps and (self.is_virtual(nm) or nm in self.pending):
                todo += list(lambda_exprs(self.maps[nm].fn))
        return out

    # -- homes, in-place state, copies

    def _assemble(
        self,
        sinks: dict[str, list[Target]],
        loop_items: list[tuple[int, Item]],
        specials: list[Special],
        lets: list[tuple[int, ir.Let]],
        stores: list[ir.StoreState],
    ) -> Plan:
        maxlv = max([lv for lv, _ in loop_items] + [s.level for s in specials] + [0])
        targets: dict[str, list[Target]] = {}
        copies: list[tuple[str, Target]] = []  # (array, target) done by copy items
        for name, ts in sinks.items():
            for t in ts:
                if t.kind == "state" and not self._in_place_ok(
                    name, t.name, loop_items, specials, lets, maxlv
                ):
                    copies.append((name, t))
                elif name in self.maps or (
                    t.kind in ("payload", "out")
                    and not targets.get(name)
                    and self.arrays[name].origin == "op"
                    and self._layout_ok(name, t)
                ):
                    targets.setdefault(name, []).append(t)
                else:
                    copies.append((name, t))
        for name, ts in targets.items():
            if ts:
                self.homes[name] = ts[0]
        items: list[tuple[int, Item]] = []
        for lv, it in loop_items:
            if it.kind == "store":
                ts = targets.get(it.op.name, [])
                it = Item("store", it.op, tuple(ts) if ts else (self.homes[it.op.name],))
            items.append((lv, it))
        final_lv = maxlv + 1
        for name, t in copies:
            a = self.arrays[name]
            j = ir.Ref(f"__c_{name}", I64)
            m = ir.Map(
                f"{name}->{t.kind}:{t.name}",
                ArrayType(a.dtype, a.length, a.bits),
                ir.Lambda((j,), (), ir.Load(name, j, a.dtype)),
            )
            lv = self.levels.get(name, 0) + 1
            if t.kind == "state":
                lv = final_lv
            items.append((lv, Item("store", m, (t,), copy=True)))
        for i, s in enumerate(specials):
            out = _special_out(s.op)
            if out is not None:
                specials[i] = Special(s.level, s.op, self.homes[out])
        steps: dict[int, Step] = {}
        own: dict[int, Loop] = {}  # filter op index -> the loop of the maps deferred to it
        for lv, it in items:
            st = steps.setdefault(lv, Step(lv))
            length = it.op.type.length if isinstance(it.op, ir.Map) else it.op.length
            d = self.deferred.get(it.op.name) if not it.copy else None
            if d is not None:
                k = d.filter
                if k not in own:
                    own[k] = Loop(lv, length)
                    st.loops.append(own[k])
                own[k].items.append(it)
                continue
            for lp in st.loops:
                if lp.length == length and all(lp is not o for o in own.values()):
                    lp.items.append(it)
                    break
            else:
                st.loops.append(Loop(lv, length, [it]))
        for s in specials:
            steps.setdefault(s.level, Step(s.level)).specials.append(s)
        for lv, let in lets:
            steps.setdefault(lv, Step(lv)).lets.append(let)
        ws = [self.arrays[n] for n, t in self.homes.items() if t.kind == "ws"]
        final_state = [s for s in stores if not isinstance(s.value, str)]
        ffs = []
        for k, lp in own.items():
            sp = next(x for x in specials if x.op is self.ops[k])
            d = next(self.deferred[it.op.name] for it in lp.items)
            ffs.append(FilterFusion(sp.level, sp, lp, d.index, d.param, d.offset))
        return Plan(
            self.fn, self.arrays, self.maps, self.homes, self.levels,
            [steps[k] for k in sorted(steps)], ws, final_state, self.cost, self.accumulate,
            deferred=frozenset(self.deferred), filter_fusions=tuple(ffs),
        )  # fmt: skip

    def _layout_ok(self, name: str, t: Target) -> bool:
        a = self.arrays[name]
        if t.kind == "out":
            return a.dtype == F32
        f = next(f for f in self.prog.payload if f.name == t.name)
        # float fields go through a copy, which stores NaN canonically
        return (
            isinstance(f.type, ArrayType)
            and f.type.bits is None
            and f.type.dtype == a.dtype
            and not a.dtype.is_float
        )

    def _in_place_ok(
        self,
        new: str,
        state: str,
        loop_items: list[tuple[int, Item]],
        specials: list[Special],
        lets: list[tuple[int, ir.Let]],
        maxlv: int,
    ) -> bool:
        """Whether ``new`` can be written straight into state array ``state``."""
        if new not in self.maps or new not in self.levels:
            return False
        wl = self.levels[new]
        m = self.maps[new]
        for lv, it in loop_items:
            length = it.op.type.length if isinstance(it.op, ir.Map) else it.op.length
            same = lv == wl and length == m.type.length
            if new in self.deferred or it.op.name in self.deferred:  # a loop of their own
                same = same and self._filter_of(new) == self._filter_of(it.op.name)
            for al in self._reads(it.op.fn, state, lv, it.op.fn.params[0].name, length):
                if lv > wl or (lv == wl and not (same and al)):
                    return False
        for s in specials:
            op = s.op.op if isinstance(s.op, ScatterAdd) else s.op
            if s.level >= wl and self._special_reads(op, state, s.level):
                return False
        for lv, let in lets:
            if lv >= wl and any(True for _ in self._reads_expr(let.value, state, lv, None, None)):
                return False
        p = self.prog
        ends = [v for v in p.encode.fields if not isinstance(v, str)]
        ends += [
            s.value
            for s in p.encode.ops
            if isinstance(s, ir.StoreState) and not isinstance(s.value, str)
        ]
        if any(True for e in ends for _ in self._reads_expr(e, state, maxlv + 1, None, None)):
            return False
        # a payload field or another state taking the old array itself
        if state in [v for v in p.encode.fields if isinstance(v, str)]:
            return False
        return not any(isinstance(s, ir.StoreState) and s.value == state for s in p.encode.ops)

    def _special_reads(self, op: ir.Op, state: str, lv: int) -> bool:
        for fn in op_lambdas(op):
            if any(True for _ in self._reads(fn, state, lv, None, None)):
                return True
        for e in op_exprs(op):
            if any(True for _ in self._reads_expr(e, state, lv, None, None)):
                return True
        if isinstance(op, ir.Scatter):
            for nm in (op.base, op.idx, op.vals):
                if nm == state:
                    return True
                if (
                    nm is not None
                    and self.is_virtual(nm)
                    and any(True for _ in self._reads(self.maps[nm].fn, state, lv, None, None))
                ):
                    return True
        return False

    def is_virtual(self, name: str) -> bool:
        return name in self.maps and name not in self.homes

    def _reads(
        self, fn: ir.Lambda, arr: str, lv: int, param: str | None, loop_len: ir.Expr | None
    ) -> Iterator[bool]:
        for e in lambda_exprs(fn):
            yield from self._reads_expr(e, arr, lv, param, loop_len)

    def _reads_expr(
        self, e: ir.Expr, arr: str, lv: int, param: str | None, loop_len: ir.Expr | None
    ) -> Iterator[bool]:
        """Yield, for each read of input array ``arr`` (through inlined maps), whether it is
        at the loop index."""
        for x in walk(e):
            if not isinstance(x, ir.Load):
                continue
            aligned = (
                param is not None
                and isinstance(x.index, ir.Ref)
                and x.index.name == param
                and self.arrays[x.array].length == loop_len
            )
            if x.array == arr:
                yield aligned
            elif x.array in self.maps and inline(self, x.array, lv, aligned):
                m = self.maps[x.array]
                inner = m.fn.params[0].name if aligned else None
                yield from self._reads(m.fn, arr, lv, inner, loop_len)


def _bound(op: ir.Filter | ir.TopK) -> ir.Expr:
    return op.bound if isinstance(op, ir.Filter) else op.k


def _nseg(op: ir.SegReduce) -> ir.Expr:
    # the same expression (and folding) as the checker's type of the result
    from hipress.compll.check_body import fold_deep

    one = ir.Const(1, I64)
    return fold_deep(
        ir.Binary(
            "div",
            ir.Binary("sub", ir.Binary("add", op.length, op.seg, I64), one, I64),
            ir.Binary("max", op.seg, one, I64),
            I64,
        )
    )


def _special_out(op: object) -> str | None:
    if isinstance(op, ir.Filter | ir.TopK):
        return op.idx
    if isinstance(op, ScatterAdd):
        return op.op.name
    if isinstance(op, ir.Sort | ir.Scan | ir.SegReduce):
        return op.name
    return None


def lower(
    prog: ir.Program,
    fn: str,
    accumulate: bool = False,
    nonfinite: bool = False,
    unfused: bool = False,
) -> Plan:
    """Plan ``prog``'s ``fn`` ("encode" or "decode"; decode with or without accumulation);
    with ``nonfinite``, an encode also finds out whether the gradient holds NaN/Inf where its
    first pass can (:mod:`hipress.compll.finite`), for a target that runs the plan's fusions
    or, with ``unfused``, one that runs every loop on its own (CUDA)."""
    if fn not in ("encode", "decode"):
        raise ValueError(f"fn must be 'encode' or 'decode', got {fn!r}")
    from hipress.compll.finite import add_flag
    from hipress.compll.fuse import segment_fusions

    plan = _Planner(prog, fn, accumulate).plan()
    plan.fusions = segment_fusions(plan)
    if nonfinite:
        add_flag(plan, prog, unfused)
    return plan


__all__ = ["lower"]
