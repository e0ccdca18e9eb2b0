"""Planner pass: whether the gradient holds NaN/Inf, as a by-product of the encode's first pass.

CaSync must know, per chunk it compresses, whether the chunk's input holds NaN/Inf (so that the
chunk comes out all-NaN on every rank and the states that encoded it are reset). A separate
check reads the gradient once more; on a CPU that can be a fifth of a compressed step of a
large model (docs/explanation/casync.md). Most encodes already read the whole gradient
in a plain loop at level 1 (onebit's compensated gradient and sums, terngrad's min and max, the
casts): one more ``any`` reduction in that loop costs a compare per element. :func:`add_flag`
adds it there; failing that, a filter's or top-k's pass that computes maps deferred to it
(hipress/compll/lower/defer.py) from the gradient computes it too. Never a pass of its own: where the
first pass is another stage (a sort, a segment reduction) the encode does not report it, and
CaSync checks.

A finite gradient can also become infinite in the encode: the casts to f16 and bf16 round
values from 65520 (f16) or about 3.3962e38 (bf16) up to infinity, as PyTorch's fp16 hook does.
Where the encode casts the gradient itself to such a type, the flag is ``!(|g[i]| < bound)``
instead (:func:`cast_bound`): one compare that is true for NaN, Inf and every value the cast
overflows, so such a chunk is flagged like a non-finite one.
"""

from __future__ import annotations

from dataclasses import replace

from hipress.compll.ir import nodes as ir
from hipress.compll.ir import ops
from hipress.compll.ir.types import BF16, BOOL, F8E5M2, F16, F32, I64
from hipress.compll.ir.walk import lambda_exprs, op_lambdas, walk
from hipress.compll.lower.kernel_plan import Item, KernelPlan, replace_loop

NONFINITE = "__nonfinite"  # the reduction's name: true if any gradient element is NaN/Inf

# the least magnitude a float32 rounds to infinity from (round to nearest even) in each type
# (f8e4m3 saturates at 448, so no finite value becomes infinite there)
CAST_BOUNDS = {
    F16.name: 65520.0,
    BF16.name: 1.99609375 * 2.0**127,  # f32 bits 0x7f7f8000
    F8E5M2.name: 61440.0,
}


def cast_bound(prog: ir.Program) -> float | None:
    """The least of :data:`CAST_BOUNDS` over the casts of a gradient element to f16/bf16 in
    ``prog``'s encode (``f16(g[i])``), or None where it has none: from that magnitude up, a
    finite gradient element is sent as infinity."""
    grad = prog.encode.grad
    bounds = [
        CAST_BOUNDS[x.dtype.name]
        for op in prog.encode.ops
        for fn in op_lambdas(op)
        for e in lambda_exprs(fn)
        for x in walk(e)
        if isinstance(x, ir.Cast) and x.dtype.name in CAST_BOUNDS
        and isinstance(x.x, ir.Load) and x.x.array == grad
    ]  # fmt: skip
    return min(bounds) if bounds else None


def _flag_fn(prog: ir.Program) -> ir.Lambda:
    """``i => !isfinite(g[i])``, or ``i => !(abs(g[i]) < bound)`` where the encode casts the
    gradient to a narrower float type (:func:`cast_bound`)."""
    i = ir.Ref("__i", I64)
    g = ir.Load(prog.encode.grad, i, F32)
    bound = cast_bound(prog)
    if bound is None:
        ok: ir.Expr = ir.Unary(ops.ISFINITE.name, g, BOOL)
    else:
        a = ir.Unary(ops.ABS.name, g, F32)
        ok = ir.Binary(ops.LT.name, a, ir.Const(bound, F32), BOOL)
    return ir.Lambda((i,), (), ir.Unary(ops.NOT.name, ok, BOOL))


def add_flag(plan: KernelPlan, prog: ir.Program, unfused: bool = False) -> KernelPlan:
    """``plan`` with the gradient's ``any(!isfinite(g[i]))`` appended to a plain loop over all
    n elements at level 1 of the encode that reads the gradient already (not one a fusion
    runs), recorded in ``nonfinite``; ``plan`` itself where there is none. ``unfused``: the
    target runs every loop on its own (CUDA), so a loop a fusion would run qualifies too, and
    so does the loop of maps deferred to a filter or top-k, at any level."""
    if plan.fn != "encode":
        return plan
    fused: set[int] = set()
    if not unfused:
        fused = {id(lp) for f in plan.fusions for lp in f.seg_loops + f.elem_loops}
        fused |= {id(f.loop) for f in plan.filter_fusions}
    n = ir.Ref(ir.N, I64)
    deferred = [f.loop for f in plan.filter_fusions] if unfused else []
    for st in plan.steps:
        for lp in st.loops:
            if (st.level != 1 and lp not in deferred) or id(lp) in fused or lp.length != n:
                continue
            if not any(_reads(plan, it.op.fn, prog.encode.grad, set()) for it in lp.items):
                continue  # (e.g. a scatter's zeroing: a read more would cost)
            fn = _flag_fn(prog)
            flag = Item("reduce", ir.Reduce(NONFINITE, ops.REDUCE_ANY.name, n, fn, BOOL))
            new = replace(lp, items=(*lp.items, flag))
            return replace(replace_loop(plan, lp, new), nonfinite=NONFINITE)
    if unfused:
        return plan
    # else a filter's or top-k's pass that stores maps deferred to it and reads the gradient
    # (dgc, graddrop, topk): it computes the flag as it goes (the C target's filter and top-k stages)
    for ff in plan.filter_fusions:
        if any(_reads(plan, it.op.fn, prog.encode.grad, set()) for it in ff.loop.items):
            return replace(plan, nonfinite=NONFINITE, nonfinite_stage=ff.special)
    return plan


def _reads(plan: KernelPlan, fn: ir.Lambda, array: str, seen: set[str]) -> bool:
    """Whether ``fn`` reads ``array``, directly or through maps it recomputes."""
    for e in lambda_exprs(fn):
        for x in walk(e):
            if not isinstance(x, ir.Load):
                continue
            if x.array == array:
                return True
            if plan.is_virtual(x.array) and x.array not in seen:
                seen.add(x.array)
                if _reads(plan, plan.maps[x.array].fn, array, seen):
                    return True
    return False
