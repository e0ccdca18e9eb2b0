"""How many times an encode must read its gradient from memory: part of the compulsory traffic
``hipress bench kernels`` measures kernels against (its roofline).

One read, unless the plan every target runs (:func:`hipress.compll.lower.lower.lower`) has a
reduction over the whole gradient (a ``reduce`` as long as it, e.g. TernGrad's min and max) whose
result a later loop as long as the gradient needs, and that loop reads the gradient again: each
element's value then depends on all of the gradient, so no kernel can finish an element in the
first pass, and a gradient larger than the caches comes from memory twice. A segment reduction
does not count (its segments fit a cache, so a kernel can reduce and consume them block by
block), nor does a reduction only read at a few gathered elements (randomk's NaN flag).
"""

from __future__ import annotations

from collections.abc import Iterator

from hipress.compll.ir import nodes as ir
from hipress.compll.ir.types import I64
from hipress.compll.ir.walk import lambda_exprs, walk
from hipress.compll.lower.kernel_plan import KernelPlan
from hipress.compll.lower.lower import lower


def grad_reads(prog: ir.Program) -> int:
    """1 or 2: the passes over the gradient ``prog``'s encode cannot avoid (module docstring)."""
    plan = lower(prog, "encode")
    g = prog.encode.grad
    full = ir.Ref(ir.N, I64)
    reductions = {
        it.op.name: lp.level
        for st in plan.steps
        for lp in st.loops
        for it in lp.items
        if it.kind == "reduce" and lp.length == full and g in _reads(plan, it.op.fn)
    }
    reductions |= {
        sp.op.name: sp.level
        for st in plan.steps
        for sp in st.specials
        if isinstance(sp.op, ir.Reduce) and sp.op.length == full and g in _reads(plan, sp.op.fn)
    }
    lets = {let.name: let.value for st in plan.steps for let in st.lets}
    for st in plan.steps:
        for lp in st.loops:
            if lp.length != full:
                continue
            for it in lp.items:
                if it.kind != "store" or not isinstance(it.op, ir.Map):
                    continue
                needs = _reads(plan, it.op.fn, lets)
                if g in needs and any(r in needs and lv < lp.level for r, lv in reductions.items()):
                    return 2
    return 1


def _reads(plan: KernelPlan, fn: ir.Lambda, lets: dict[str, ir.Expr] | None = None) -> set[str]:
    """The arrays and scalars ``fn`` reads, through the maps it inlines (virtual ones) and, with
    ``lets``, the host scalars it uses (their own inputs included)."""
    seen: set[str] = set()
    todo = list(_names(lambda_exprs(fn)))
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if plan.is_virtual(name):
            todo.extend(_names(lambda_exprs(plan.maps[name].fn)))
        elif lets is not None and name in lets:
            todo.extend(_names(iter((lets[name],))))
    return seen


def _names(exprs: Iterator[ir.Expr]) -> Iterator[str]:
    for e in exprs:
        for x in walk(e):
            if isinstance(x, ir.Load):
                yield x.array
            elif isinstance(x, ir.Ref):
                yield x.name


__all__ = ["grad_reads"]
