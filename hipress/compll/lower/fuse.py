"""Planner pass: fuse a segment reduction with the loops that consume it (plan -> fusions).

A ``segreduce`` is a stage of its own: one pass over its input, and its consumers (typically a
per-segment map such as a scale, then an elementwise map that reads it at ``[i / seg]``) read
the input again in another pass. When the consumers only ever read the reduction, and each other,
inside the segment of the element they compute, the work can run block by block of whole
segments instead: reduce the block's segments, compute the per-segment loops over them, then the
elementwise loops over the block's elements while those are still in cache (one pass over memory).

:func:`segment_fusions` finds such groups in a finished plan. A group is a segreduce ``S`` that is
alone in its level ``L`` (no loops, no host lets) with a constant segment length ``seg >= 1``;
the fused loops are those of level ``L + 1`` as long as ``S``'s result (per segment) or as its
input (per element), and, when every loop of ``L + 1`` is fused and that level has no specials
or lets, the per-element loops of ``L + 2``. Every fused loop must consist of plain stores (no
reductions, no copies, no packed arrays, no random numbers, no state written) and every array
read inside it (through inlined maps) must be:

- ready before ``L`` (an input, or stored at a lower level), or
- ``S`` or a fused loop's result, read at the position being computed: a per-segment array at
  the segment's index (``[s]`` in a per-segment loop, ``[i / seg]`` in a per-element one), a
  per-element array at ``[i]``.

Anything else keeps the plain schedule (the plan's steps, which every target can run).
"""

from __future__ import annotations

from dataclasses import replace

from hipress.compll.ir import nodes as ir
from hipress.compll.ir import ops
from hipress.compll.ir.walk import lambda_exprs, walk
from hipress.compll.lower.kernel_plan import KernelPlan, Loop, SegFusion, Step


def fuse(plan: KernelPlan) -> KernelPlan:
    """``plan`` with its segment-reduction groups (:func:`segment_fusions`) in ``fusions``."""
    return replace(plan, fusions=segment_fusions(plan))


def segment_fusions(plan: KernelPlan) -> tuple[SegFusion, ...]:
    """The segment-reduction groups of ``plan`` that may run fused (see the module docstring);
    each loop belongs to at most one group."""
    by_level = {st.level: st for st in plan.steps}
    out: list[SegFusion] = []
    for st in plan.steps:
        f = _fusion(plan, st, by_level)
        if f is not None:
            out.append(f)
    return tuple(out)


def _fusion(plan: KernelPlan, st: Step, by_level: dict[int, Step]) -> SegFusion | None:
    if st.loops or st.lets or len(st.specials) != 1:
        return None
    sp = st.specials[0]
    op = sp.op
    if not isinstance(op, ir.SegReduce) or sp.home is None or op.matmul is not None:
        return None
    if not (isinstance(op.seg, ir.Const) and int(op.seg.value) >= 1):
        return None
    nseg = plan.arrays[op.name].length
    if nseg == op.length:
        return None
    lv = st.level
    s1 = by_level.get(lv + 1)
    if s1 is None:
        return None
    group = {op.name}
    seg_loops = [lp for lp in s1.loops if lp.length == nseg and _plain(plan, lp)]
    elem1 = [lp for lp in s1.loops if lp.length == op.length and _plain(plan, lp)]
    for lp in seg_loops + elem1:
        group.update(it.op.name for it in lp.items)
    elem2: list[Loop] = []
    s2 = by_level.get(lv + 2)
    if (
        s2 is not None
        and len(seg_loops) + len(elem1) == len(s1.loops)
        and not s1.specials
        and not s1.lets
    ):
        elem2 = [lp for lp in s2.loops if lp.length == op.length and _plain(plan, lp)]
        for lp in elem2:
            group.update(it.op.name for it in lp.items)
    ctx = _Ctx(plan, lv, group, op.seg, nseg, op.length)
    seg_ok = [lp for lp in seg_loops if ctx.loop_ok(lp, "seg")]
    if len(seg_ok) != len(seg_loops):
        return None  # a per-segment result read by the element loops must be ready per block
    elem_ok = [lp for lp in elem1 + elem2 if ctx.loop_ok(lp, "elem")]
    if len(elem_ok) != len(elem1 + elem2) or not elem_ok:
        return None
    return SegFusion(lv, sp, int(op.seg.value), tuple(seg_ok), tuple(elem_ok))


def _plain(plan: KernelPlan, lp: Loop) -> bool:
    """Stores of maps without packing into non-state targets, nothing else."""
    for it in lp.items:
        if it.kind != "store" or it.copy or not isinstance(it.op, ir.Map):
            return False
        if it.op.name not in plan.maps or it.op.type.bits is not None:
            return False
        if any(t.kind == "state" for t in it.targets):
            return False
    return True


class _Ctx:
    """The read check of one candidate group."""

    def __init__(
        self,
        plan: KernelPlan,
        level: int,
        group: set[str],
        seg: ir.Expr,
        nseg: ir.Expr,
        elen: ir.Expr,
    ) -> None:
        self.plan = plan
        self.level = level
        self.group = group
        self.seg = seg
        self.nseg = nseg
        self.elen = elen

    def loop_ok(self, lp: Loop, dom: str) -> bool:
        return all(
            self._lambda_ok(it.op.fn, dom, True, lp.level, lp.length)
            for it in lp.items
            if isinstance(it.op, ir.Map)
        )

    def _domain(self, length: ir.Expr) -> str | None:
        if length == self.nseg:
            return "seg"
        if length == self.elen:
            return "elem"
        return None

    def _position(self, index: ir.Expr, param: str, pdom: str | None) -> str | None:
        """The domain whose current position ``index`` denotes, if any."""
        if isinstance(index, ir.Ref) and index.name == param:
            return pdom
        if (
            pdom == "elem"
            and isinstance(index, ir.Binary)
            and index.op == ops.DIV.name
            and isinstance(index.a, ir.Ref)
            and index.a.name == param
            and index.b == self.seg
        ):
            return "seg"
        return None

    def _lambda_ok(
        self, fn: ir.Lambda, pdom: str | None, is_index: bool, lv: int, loop_len: ir.Expr
    ) -> bool:
        """Whether every read of ``fn`` (param at the current position of ``pdom``, or at no
        known position; ``is_index``: the param is the loop index itself) is allowed."""
        plan = self.plan
        param = fn.params[0].name if fn.params else ""
        for e in lambda_exprs(fn):
            for x in walk(e):
                if isinstance(x, ir.Rand):
                    return False
                if not isinstance(x, ir.Load):
                    continue
                a = plan.arrays[x.array]
                if a.bits is not None:
                    return False
                pos = self._position(x.index, param, pdom)
                aligned = (
                    is_index
                    and isinstance(x.index, ir.Ref)
                    and x.index.name == param
                    and a.length == loop_len
                )
                inlined = plan.is_virtual(x.array) or plan.inline_read(x.array, lv, aligned)
                if x.array in self.group and (pos is None or pos != self._domain(a.length)):
                    return False
                if inlined:
                    m = plan.maps[x.array]
                    if not self._lambda_ok(m.fn, pos, aligned, lv, loop_len):
                        return False
                elif (
                    x.array not in self.group
                    and a.origin not in ("grad", "state", "payload")
                    and plan.levels.get(x.array, self.level) >= self.level
                ):
                    return False  # computed in or after the reduction's level, not by us
        return True


__all__ = ["fuse", "segment_fusions"]
