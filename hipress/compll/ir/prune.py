"""Dead-code removal: a program's ops without the ones whose results nothing uses.

Everything in the IR is pure (random numbers are a function of their counter), so an op whose
results reach no payload field, no new state, no decode result and no op that does is removed,
and so is a lambda's ``let`` that its result does not reach. The checker runs this on every
program it emits, after parameters are folded: a value whose only use a folded ``?:`` dropped is
removed too. The reference interpreter and every backend therefore run the same, smaller
program, and an unused ``segreduce`` costs nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

from hipress.compll.ir import nodes as ir
from hipress.compll.ir.walk import op_exprs, op_lambdas, walk


def prune(prog: ir.Program) -> ir.Program:
    """``prog`` with the ops and lambda lets nothing uses removed (the same object when there
    are none)."""
    enc_live = {v for v in prog.encode.fields if isinstance(v, str)}
    enc_live |= _reads(e for v in prog.encode.fields if not isinstance(v, str) for e in walk(v))
    enc = _live_ops(prog.encode.ops, enc_live)
    dec = _live_ops(prog.decode.ops, {prog.decode.result})
    if enc == prog.encode.ops and dec == prog.decode.ops:
        return prog
    return ir.Program(
        name=prog.name,
        doc=prog.doc,
        params=prog.params,
        state=prog.state,
        payload=prog.payload,
        encode=ir.Encode(prog.encode.grad, enc, prog.encode.fields),
        decode=ir.Decode(prog.decode.payload, dec, prog.decode.result),
    )


def _live_ops(ops: tuple[ir.Op, ...], live: set[str]) -> tuple[ir.Op, ...]:
    """``ops`` without those whose results are not in ``live`` (the names read after them) nor
    read by a kept op; state stores are always kept."""
    kept: list[ir.Op] = []
    for op in reversed(ops):
        if not isinstance(op, ir.StoreState) and not (set(_defines(op)) & live):
            continue
        if isinstance(op, ir.Block):  # its ops, as if they stood here (their reads stay inside)
            op = ir.Block(op.size, op.length, _live_ops(op.ops, set(live)))
        else:
            op = _pruned_lambdas(op)
        kept.append(op)
        live |= _op_reads(op)
    return tuple(reversed(kept))


def _defines(op: ir.Op) -> tuple[str, ...]:
    if isinstance(op, ir.Filter | ir.TopK):
        return (op.idx, op.count)
    if isinstance(op, ir.StoreState):
        return ()
    if isinstance(op, ir.Block):
        return tuple(x for o in op.ops for x in _defines(o))
    return (op.name,)


def _op_reads(op: ir.Op) -> set[str]:
    """Every array and scalar name ``op`` reads."""
    out = _reads(e for x in op_exprs(op) for e in walk(x))
    for fn in op_lambdas(op):
        for _, v in fn.lets:
            out |= _reads(walk(v))
        out |= _reads(walk(fn.result))
    if isinstance(op, ir.Scatter):
        out |= {op.idx, op.vals} | ({op.base} if op.base is not None else set())
    if isinstance(op, ir.StoreState) and isinstance(op.value, str):
        out.add(op.value)
    return out


def _reads(exprs: Iterable[ir.Expr]) -> set[str]:
    out: set[str] = set()
    for e in exprs:
        if isinstance(e, ir.Ref):
            out.add(e.name)
        elif isinstance(e, ir.Load):
            out.add(e.array)
    return out


def _pruned_lambdas(op: ir.Op) -> ir.Op:
    """``op`` with each of its lambdas' unused lets removed."""
    if isinstance(op, ir.Map):
        return ir.Map(op.name, op.type, _lambda(op.fn))
    if isinstance(op, ir.Reduce):
        comb = _lambda(op.combine) if op.combine is not None else None
        return ir.Reduce(op.name, op.op, op.length, _lambda(op.fn), op.dtype, comb, op.init)
    if isinstance(op, ir.SegReduce):
        return ir.SegReduce(op.name, op.op, op.length, op.seg, _lambda(op.fn), op.dtype, op.matmul)
    if isinstance(op, ir.Filter):
        return ir.Filter(op.idx, op.count, op.length, op.bound, _lambda(op.pred))
    if isinstance(op, ir.TopK):
        return ir.TopK(op.idx, op.count, op.length, op.k, _lambda(op.key))
    if isinstance(op, ir.Sort):
        return ir.Sort(op.name, op.length, _lambda(op.key), op.dtype)
    if isinstance(op, ir.Scan):
        return ir.Scan(op.name, op.op, op.length, _lambda(op.fn), op.dtype)
    return op


def _lambda(fn: ir.Lambda) -> ir.Lambda:
    live = _reads(walk(fn.result))
    lets: list[tuple[str, ir.Expr]] = []
    for name, v in reversed(fn.lets):
        if name in live:
            lets.append((name, v))
            live |= _reads(walk(v))
    if len(lets) == len(fn.lets):
        return fn
    return ir.Lambda(fn.params, tuple(reversed(lets)), fn.result)
