"""Planner step: placement -> plan. Decides which sinks are written in place and which are
copied, and groups the loop items of each level into loops (see
:mod:`hipress.compll.lower.lower` for the rules).

A new state array is written in place when no later reader needs the old values; otherwise it
goes to the workspace and is copied at the end. A payload field or decode output that a stage
produces is written there directly when its layout allows, else copied.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from hipress.compll.ir import nodes as ir
from hipress.compll.ir.types import F32, I64, ArrayType
from hipress.compll.ir.walk import lambda_exprs, op_exprs, op_lambdas, walk
from hipress.compll.lower.kernel_plan import (
    Destination,
    FilterFusion,
    Item,
    KernelPlan,
    Loop,
    ScatterAdd,
    Special,
    Step,
    frozen,
    inline,
)
from hipress.compll.lower.place import Placement


def assemble(pl: Placement) -> KernelPlan:
    """The plan of placement ``pl`` (no fusions yet: :mod:`hipress.compll.lower.fuse`)."""
    return _Assembler(pl).plan()


@dataclass
class _Draft:
    """A loop while its items are collected."""

    level: int
    length: ir.Expr
    items: list[Item] = field(default_factory=list)


def _length(it: Item) -> ir.Expr:
    return it.op.type.length if isinstance(it.op, ir.Map) else it.op.length


class _Assembler:
    def __init__(self, pl: Placement) -> None:
        self.pl = pl
        self.homes = dict(pl.homes)
        levels = [lv for lv, _ in pl.loop_items] + [s.level for s in pl.specials]
        self.maxlv = max([*levels, 0])

    def plan(self) -> KernelPlan:
        pl = self.pl
        targets, copies = self._sinks()
        for name, ts in targets.items():
            if ts:
                self.homes[name] = ts[0]
        items = self._items(targets, copies)
        specials = []
        for s in pl.specials:
            out = _special_out(s.op)
            specials.append(s if out is None else Special(s.level, s.op, self.homes[out]))
        steps, ffs = self._steps(items, specials)
        ws = tuple(pl.arrays[n] for n, t in self.homes.items() if t.kind == "ws")
        final_state = tuple(s for s in pl.stores if not isinstance(s.value, str))
        return KernelPlan(
            pl.fn, pl.arrays, pl.maps, frozen(self.homes), pl.levels, steps, ws, final_state,
            pl.cost, pl.accumulate, deferred=frozenset(pl.deferred), filter_fusions=ffs,
        )  # fmt: skip

    def _sinks(self) -> tuple[dict[str, list[Destination]], list[tuple[str, Destination]]]:
        """The targets each sink is stored to by its own loop item, and the (array, target)
        pairs that copy items store instead."""
        pl = self.pl
        targets: dict[str, list[Destination]] = {}
        copies: list[tuple[str, Destination]] = []
        for name, ts in pl.sinks.items():
            for t in ts:
                if t.kind == "state" and not self._in_place_ok(name, t.name):
                    copies.append((name, t))
                elif name in pl.maps or (
                    t.kind in ("payload", "out")
                    and not targets.get(name)
                    and pl.arrays[name].origin == "op"
                    and self._layout_ok(name, t)
                ):
                    targets.setdefault(name, []).append(t)
                else:
                    copies.append((name, t))
        return targets, copies

    def _items(
        self, targets: dict[str, list[Destination]], copies: list[tuple[str, Destination]]
    ) -> list[tuple[int, Item]]:
        """The loop items with their targets, then the copy items, with their levels."""
        pl = self.pl
        items: list[tuple[int, Item]] = []
        for lv, it in pl.loop_items:
            if it.kind == "store":
                ts = targets.get(it.op.name, [])
                it = Item("store", it.op, tuple(ts) if ts else (self.homes[it.op.name],))
            items.append((lv, it))
        for name, t in copies:
            a = pl.arrays[name]
            j = ir.Ref(f"__c_{name}", I64)
            m = ir.Map(
                f"{name}->{t.kind}:{t.name}",
                ArrayType(a.dtype, a.length, self._field_bits(t, a.bits)),
                ir.Lambda((j,), (), ir.Load(name, j, a.dtype)),
            )
            lv = self.maxlv + 1 if t.kind == "state" else pl.levels.get(name, 0) + 1
            items.append((lv, Item("store", m, (t,), copy=True)))
        return items

    def _steps(
        self, items: list[tuple[int, Item]], specials: list[Special]
    ) -> tuple[tuple[Step, ...], tuple[FilterFusion, ...]]:
        """The steps, level by level: items of one level and length share a loop, except the
        maps deferred to a filter, which get a loop of their own (its :class:`FilterFusion`)."""
        pl = self.pl
        loops: dict[int, list[_Draft]] = {}
        own: dict[int, _Draft] = {}  # filter op index -> the loop of the maps deferred to it
        for lv, it in items:
            drafts = loops.setdefault(lv, [])
            d = pl.deferred.get(it.op.name) if not it.copy else None
            if d is not None:
                if d.filter not in own:
                    own[d.filter] = _Draft(lv, _length(it))
                    drafts.append(own[d.filter])
                own[d.filter].items.append(it)
                continue
            for dr in drafts:
                if dr.length == _length(it) and all(dr is not o for o in own.values()):
                    dr.items.append(it)
                    break
            else:
                drafts.append(_Draft(lv, _length(it), [it]))
        done = {id(dr): Loop(dr.level, dr.length, tuple(dr.items)) for ds in loops.values()
                for dr in ds}  # fmt: skip
        levels = sorted({*loops, *(s.level for s in specials), *(lv for lv, _ in pl.lets)})
        steps = tuple(
            Step(
                lv,
                tuple(done[id(dr)] for dr in loops.get(lv, [])),
                tuple(s for s in specials if s.level == lv),
                tuple(let for llv, let in pl.lets if llv == lv),
            )
            for lv in levels
        )
        ffs = []
        for k, dr in own.items():
            sp = next(x for x in specials if x.op is pl.ops[k])
            d = next(pl.deferred[it.op.name] for it in dr.items)
            ffs.append(FilterFusion(sp.level, sp, done[id(dr)], d.index, d.param, d.offset))
        return steps, tuple(ffs)

    def _field_bits(self, t: Destination, bits: int | None) -> int | None:
        """The packing of what a copy to ``t`` stores: a payload field's own (a section's
        packed array is stored unpacked), else ``bits``."""
        if t.kind != "payload":
            return bits
        f = next(f for f in self.pl.prog.payload if f.name == t.name)
        return f.type.bits if isinstance(f.type, ArrayType) else bits

    def _layout_ok(self, name: str, t: Destination) -> bool:
        a = self.pl.arrays[name]
        if t.kind == "out":
            return a.dtype == F32
        f = next(f for f in self.pl.prog.payload if f.name == t.name)
        # float fields go through a copy, which stores NaN canonically
        return (
            isinstance(f.type, ArrayType)
            and f.type.bits is None
            and f.type.dtype == a.dtype
            and not a.dtype.is_float
        )

    def _in_place_ok(self, new: str, state: str) -> bool:
        """Whether ``new`` can be written straight into state array ``state``."""
        pl = self.pl
        if new not in pl.maps or new not in pl.levels:
            return False
        wl = pl.levels[new]
        m = pl.maps[new]
        for lv, it in pl.loop_items:
            length = _length(it)
            same = lv == wl and length == m.type.length
            if new in pl.deferred or it.op.name in pl.deferred:  # a loop of their own
                same = same and pl.filter_of(new) == pl.filter_of(it.op.name)
            for al in self._reads(it.op.fn, state, lv, it.op.fn.params[0].name, length):
                if lv > wl or (lv == wl and not (same and al)):
                    return False
        for s in pl.specials:
            op = s.op.op if isinstance(s.op, ScatterAdd) else s.op
            if s.level >= wl and self._special_reads(op, state, s.level):
                return False
        for lv, let in pl.lets:
            if lv >= wl and any(True for _ in self._reads_expr(let.value, state, lv, None, None)):
                return False
        enc = pl.prog.encode
        ends = [v for v in enc.fields if not isinstance(v, str)]
        ends += [
            s.value
            for s in enc.ops
            if isinstance(s, ir.StoreState) and not isinstance(s.value, str)
        ]
        if any(True for e in ends for _ in self._reads_expr(e, state, self.maxlv + 1, None, None)):
            return False
        # a payload field or another state taking the old array itself
        if state in [v for v in enc.fields if isinstance(v, str)]:
            return False
        return not any(isinstance(s, ir.StoreState) and s.value == state for s in enc.ops)

    def _special_reads(self, op: ir.Op, state: str, lv: int) -> bool:
        pl = self.pl
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
                    and pl.is_virtual(nm)
                    and any(True for _ in self._reads(pl.maps[nm].fn, state, lv, None, None))
                ):
                    return True
        return False

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
        pl = self.pl
        for x in walk(e):
            if not isinstance(x, ir.Load):
                continue
            aligned = (
                param is not None
                and isinstance(x.index, ir.Ref)
                and x.index.name == param
                and pl.arrays[x.array].length == loop_len
            )
            if x.array == arr:
                yield aligned
            elif x.array in pl.maps and inline(pl, x.array, lv, aligned):
                m = pl.maps[x.array]
                inner = m.fn.params[0].name if aligned else None
                yield from self._reads(m.fn, arr, lv, inner, loop_len)


def _special_out(op: object) -> str | None:
    if isinstance(op, ir.Filter | ir.TopK):
        return op.idx
    if isinstance(op, ScatterAdd):
        return op.op.name
    if isinstance(op, ir.Sort | ir.Scan | ir.SegReduce):
        return op.name
    return None
