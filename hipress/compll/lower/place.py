"""Planner step: where each array lives and at which level each op runs (IR -> placement).

Every map is virtual, or stored in the workspace (or deferred to a filter, see
:mod:`hipress.compll.lower.defer`); every stored map, reduction, stage and host ``let`` gets the
first level at which everything it reads is ready. :mod:`hipress.compll.lower.assemble` turns
the :class:`Placement` into the plan's steps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hipress.compll.ir import nodes as ir
from hipress.compll.ir import ops
from hipress.compll.ir.fold import segment_count
from hipress.compll.ir.types import F32, I32, I64, ArrayType
from hipress.compll.ir.walk import lambda_exprs, matmul_operands, op_exprs, op_lambdas, walk
from hipress.compll.lower.defer import Deferral, deferrable
from hipress.compll.lower.kernel_plan import (
    CHEAP,
    Array,
    Destination,
    Item,
    ScatterAdd,
    Special,
    frozen,
)
from hipress.compll.lower.place_block import declare_block, place_block


@dataclass(frozen=True)
class Placement:
    """What the placer decided for one function: ``homes`` of the stored arrays (virtual maps
    are absent), ``levels`` of stored arrays and reductions, the maps ``deferred`` to their
    filter, where each sink goes (``sinks``), and the loop items, stages, host lets (with
    their levels) and scalar state stores, in op order."""

    prog: ir.Program
    fn: str
    accumulate: bool
    ops: Sequence[ir.Op]
    arrays: Mapping[str, Array]
    maps: Mapping[str, ir.Map]
    homes: Mapping[str, Destination]
    levels: Mapping[str, int]
    cost: Mapping[str, int]
    deferred: Mapping[str, Deferral]
    sinks: Mapping[str, tuple[Destination, ...]]
    loop_items: tuple[tuple[int, Item], ...]
    specials: tuple[Special, ...]
    lets: tuple[tuple[int, ir.Let], ...]
    stores: tuple[ir.StoreState, ...]

    def is_virtual(self, name: str) -> bool:
        return name in self.maps and name not in self.homes

    def filter_of(self, name: str) -> int | None:
        """The op index of the filter a deferred map is stored with (None if not deferred)."""
        d = self.deferred.get(name)
        return None if d is None else d.filter


def place(prog: ir.Program, fn: str, accumulate: bool) -> Placement:
    """The :class:`Placement` of ``prog``'s ``fn`` ("encode" or "decode")."""
    return _Placer(prog, fn, accumulate).place()


_GATHER = 25  # cost of a read from memory at an index that does not move with the loop


def _streamed(index: ir.Expr, param: str | None) -> bool:
    """Whether reads at ``index`` move through memory with the loop: ``[i]``, segment reads
    ``[i / d]`` and rotated reads ``[(i + h) % len]`` (the C target buffers or unswitches the
    latter two per tile); other indices are gathers."""
    if isinstance(index, ir.Ref):
        return index.name == param
    if isinstance(index, ir.Binary) and index.op in (ops.DIV.name, ops.MOD.name):
        a = index.a
        if index.op == ops.MOD.name and isinstance(a, ir.Binary) and a.op == ops.ADD.name:
            return any(isinstance(t, ir.Ref) and t.name == param for t in (a.a, a.b))
        return isinstance(a, ir.Ref) and a.name == param
    return False


def _cost_expr(e: ir.Expr) -> int:
    c = 0
    for x in walk(e):
        c += 1
        if isinstance(x, ir.Rand):
            c += 50
        elif (
            isinstance(x, ir.Binary)
            and x.op in (ops.DIV.name, ops.MOD.name)
            and not x.dtype.is_float
        ):
            c += 10
        elif (isinstance(x, ir.Binary) and x.op == ops.MOD.name) or (
            isinstance(x, ir.Unary) and x.op == ops.SQRT.name
        ):
            c += 5
    return c


class _Placer:
    """Decides the home and level of every array and op of one function (see the module
    docstring); :meth:`place` runs once."""

    def __init__(self, prog: ir.Program, fn: str, accumulate: bool) -> None:
        self.prog = prog
        self.fn = fn
        self.accumulate = accumulate
        self.ops = prog.encode.ops if fn == "encode" else prog.decode.ops
        self.arrays: dict[str, Array] = {}
        self.maps: dict[str, ir.Map] = {}
        self.scalar_ready: dict[str, int] = {}
        self.levels: dict[str, int] = {}
        self.homes: dict[str, Destination] = {}
        self.cost: dict[str, int] = {}
        # deferred maps: filter op index, and the filter's index of its read
        self.pending: dict[str, Deferral] = {}  # not placed yet (read as if virtual)
        self.deferred: dict[str, Deferral] = {}  # placed at their filter's level
        self.read_at: dict[str, int] = {}  # pending map -> the last level that read it
        self.loop_items: list[tuple[int, Item]] = []  # (level, item)
        self.specials: list[Special] = []
        self.lets: list[tuple[int, ir.Let]] = []
        self.stores: list[ir.StoreState] = []
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
                self.arrays[op.name] = Array(
                    op.name, op.dtype, segment_count(op.length, op.seg), None, "op"
                )
            elif isinstance(op, ir.Block):
                declare_block(self, op)
        for name, m in self.maps.items():
            self.cost[name] = self._lambda_cost(m.fn, set())

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

    def _sinks(self) -> dict[str, list[Destination]]:
        sinks: dict[str, list[Destination]] = {}
        p = self.prog
        if self.fn == "encode":
            for f, v in zip(p.payload, p.encode.fields, strict=True):
                if isinstance(v, str):
                    sinks.setdefault(v, []).append(Destination("payload", f.name))
            for op in self.ops:
                if isinstance(op, ir.StoreState) and isinstance(op.value, str):
                    sinks.setdefault(op.value, []).append(Destination("state", op.state))
        else:
            kind = "outacc" if self.accumulate else "out"
            sinks.setdefault(p.decode.result, []).append(Destination(kind, "out"))
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
        if a.origin in ("grad", "state", "payload", "block"):
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

    def is_virtual(self, name: str) -> bool:
        return name in self.maps and name not in self.homes

    def place(self) -> Placement:
        sinks = self._sinks()
        uses, operands = self._uses(), matmul_operands(self.ops)
        for name in self.maps:
            us = uses.get(name, [])
            expensive = self.cost[name] > CHEAP
            many = len({k for k, _ in us}) > 1 or any(not al for _, al in us)
            if name in sinks or name in operands or (expensive and many):
                self.homes[name] = Destination("ws", name)
        self.pending, virtual = deferrable(self, sinks, uses)
        for name in virtual:
            del self.homes[name]
        for k, op in enumerate(self.ops):
            lv = self._place_op(k, op)
            if self.pending:
                for x in self._reads_pending(op):
                    self.read_at[x] = max(self.read_at.get(x, 0), lv)
        return Placement(
            self.prog, self.fn, self.accumulate, tuple(self.ops), frozen(self.arrays),
            frozen(self.maps), frozen(self.homes), frozen(self.levels), frozen(self.cost),
            frozen(self.deferred), frozen({k: tuple(v) for k, v in sinks.items()}),
            tuple(self.loop_items), tuple(self.specials), tuple(self.lets), tuple(self.stores),
        )  # fmt: skip

    def _place_op(self, k: int, op: ir.Op) -> int:
        """Place op number ``k``; return its level (0 where it has none)."""
        if isinstance(op, ir.Let):
            lv = self._ready_expr(op.value, None, None)
            self.scalar_ready[op.name] = lv
            self.lets.append((lv, op))
            return lv
        if isinstance(op, ir.Map):
            if op.name not in self.homes or op.name in self.pending:
                return 0  # virtual, or placed with its filter
            lv = max(1, self._ready_lambda(op.fn, op.type.length) + 1)
            self.levels[op.name] = lv
            self.loop_items.append((lv, Item("store", op)))
            return lv
        if isinstance(op, ir.Reduce):
            return self._place_reduce(op)
        if isinstance(op, ir.Scatter):
            return self._place_scatter(op)
        if isinstance(op, ir.StoreState):
            self.stores.append(op)
            return 0
        return self._place_stage(k, op)

    def _place_reduce(self, op: ir.Reduce) -> int:
        lv = max(1, self._ready_lambda(op.fn, op.length) + 1)
        hostr = self._ready_expr(op.length, None, None)
        if op.init is not None:
            hostr = max(hostr, self._ready_expr(op.init, None, None))
        lv = max(lv, hostr + 1)
        if op.op == ops.REDUCE_CUSTOM.name:
            if op.combine is None:  # pragma: no cover - the checker gives every custom one
                raise ValueError(f"custom reduction {op.name} has no combine")
            lv = max(lv, self._ready_lambda(op.combine, None) + 1)
            self.specials.append(Special(lv, op, None))
        else:
            self.loop_items.append((lv, Item("reduce", op)))
        self.scalar_ready[op.name] = lv
        return lv

    def _place_scatter(self, op: ir.Scatter) -> int:
        """A scatter: a loop item that stores its initial values, then the sequential adds."""
        self.homes[op.name] = Destination("ws", op.name)
        base = (
            ir.Load(op.base, ir.Ref("__j", I64), op.dtype)
            if op.base is not None
            else ir.Const(0, op.dtype)
        )
        init = ir.Map(
            op.name, ArrayType(op.dtype, op.length), ir.Lambda((ir.Ref("__j", I64),), (), base)
        )
        li = max(1, self._ready_lambda(init.fn, op.length) + 1)
        la = li + 1
        for nm in (op.idx, op.vals):
            la = max(la, self._ready_load(ir.Load(nm, ir.Const(0, I64), I64), None, None) + 1)
        la = max(la, self._ready_expr(op.count, None, None) + 1)
        self.loop_items.append((li, Item("store", init)))
        self.specials.append(Special(la, ScatterAdd(op), None))
        self.levels[op.name] = la
        return la

    def _place_stage(self, k: int, op: ir.Op) -> int:
        """A stage of its own (filter, top-k, sort, scan, segment reduction), after everything
        it reads and everything that read the maps deferred to it (stored at its level)."""
        lv = 1
        for fn in op_lambdas(op):
            lv = max(lv, self._ready_lambda(fn, None) + 1)
        for e in op_exprs(op):
            lv = max(lv, self._ready_expr(e, None, None) + 1)
        for x, d in self.pending.items():
            if d.filter == k:
                lv = max(lv, self.read_at.get(x, 0) + 1)
        if isinstance(op, ir.Filter | ir.TopK):
            self.specials.append(Special(lv, op, None))
            self.homes[op.idx] = Destination("ws", op.idx)
            self.levels[op.idx] = lv
            self.scalar_ready[op.count] = lv
            for name in [x for x, d in self.pending.items() if d.filter == k]:
                self.deferred[name] = self.pending.pop(name)
                self.levels[name] = lv
                self.loop_items.append((lv, Item("store", self.maps[name])))
        elif isinstance(op, ir.Sort | ir.Scan | ir.SegReduce):
            self.specials.append(Special(lv, op, None))
            self.homes[op.name] = Destination("ws", op.name)
            self.levels[op.name] = lv
        else:
            place_block(self, op, lv)
        return lv

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


def _bound(op: ir.Filter | ir.TopK) -> ir.Expr:
    return op.bound if isinstance(op, ir.Filter) else op.k
