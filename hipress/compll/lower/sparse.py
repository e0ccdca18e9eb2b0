"""Recognising a sparse decode: the payload's (index, value) pairs scattered into zeros, plus a
flag that is 0 or NaN.

topk, randomk, dgc and graddrop decode this way::

    let flag = reduce(sum, K, j => p.val[j] * 0.0);              // or j < p.count ? ... : 0.0
    let s = scatter(n, p.idx, p.val);                            // or with p.count
    return map(n, i => s[i] + flag);

Summing several such decodes (CaSync's averaging, ``decode_sum``) needs no per-payload pass
over the output: the pairs of every payload can be added straight into one zeroed output, in
payload order, and the flags once at the end. That is exactly the float32 sum of the decodes
when no payload repeats an index (a sum of zeros and values never gives -0.0, so adding a 0
flag or skipping an untouched element changes nothing); the C kernel checks that per payload
(indices ascending, or ascending rotated once, as dgc's and graddrop's are) and falls back to
decoding payload by payload otherwise. :func:`sparse_decode` says whether a program's decode
has exactly this form, structurally, so the fast path never applies to anything else.
"""

from __future__ import annotations

from dataclasses import dataclass

from hipress.compll.ir import nodes as ir
from hipress.compll.ir import ops
from hipress.compll.ir.types import I64, ArrayType


@dataclass(frozen=True)
class SparseDecode:
    """Where a sparse decode's pairs are: payload fields ``idx`` (int32) and ``val`` (float32)
    of ``length`` elements, of which the first ``count`` (clipped to [0, length]) are sent."""

    idx: str
    val: str
    length: ir.Expr
    count: ir.Expr


def _field(prog: ir.Program, ref: str, dtype: str) -> ArrayType | None:
    prefix = f"{prog.decode.payload}."
    if not ref.startswith(prefix):
        return None
    for f in prog.payload:
        if f.name == ref[len(prefix) :] and isinstance(f.type, ArrayType):
            ok = f.type.dtype.name == dtype and f.type.bits is None
            return f.type if ok else None
    return None


def _times_zero(e: ir.Expr, vals: str, j: ir.Ref) -> bool:
    """``vals[j] * 0.0``: 0 for a finite value, NaN otherwise."""
    return (
        isinstance(e, ir.Binary)
        and e.op == ops.MUL.name
        and e.a == ir.Load(vals, j, e.a.dtype)
        and isinstance(e.b, ir.Const)
        and e.b.value == 0.0
        and e.dtype.name == "f32"
    )


def sparse_decode(prog: ir.Program) -> SparseDecode | None:
    """The :class:`SparseDecode` of ``prog``'s decode if it has exactly the form in the module
    docstring, else None."""
    dec_ops = prog.decode.ops
    reds = [op for op in dec_ops if isinstance(op, ir.Reduce)]
    scats = [op for op in dec_ops if isinstance(op, ir.Scatter)]
    maps = [op for op in dec_ops if isinstance(op, ir.Map)]
    if len(dec_ops) != 3 or len(reds) != 1 or len(scats) != 1 or len(maps) != 1:
        return None
    red, sc, mp = reds[0], scats[0], maps[0]
    n = ir.Ref(ir.N, I64)
    idx_t, val_t = _field(prog, sc.idx, "i32"), _field(prog, sc.vals, "f32")
    if idx_t is None or val_t is None or idx_t.length != val_t.length:
        return None
    if sc.base is not None or sc.mode != "add" or sc.length != n or sc.dtype.name != "f32":
        return None
    # the output: s[i] + flag over n elements
    if mp.name != prog.decode.result or mp.type.length != n or mp.type.bits is not None:
        return None
    (i,) = mp.fn.params
    want = ir.Binary(
        ops.ADD.name, ir.Load(sc.name, i, sc.dtype), ir.Ref(red.name, red.dtype), sc.dtype
    )
    if mp.fn.lets or mp.fn.result != want:
        return None
    # the flag: the sent values times 0, summed
    if (
        red.op != ops.REDUCE_SUM.name
        or red.combine is not None
        or red.init is not None
        or red.fn.lets
    ):
        return None
    if red.dtype.name != "f32" or red.length != val_t.length:
        return None
    (j,) = red.fn.params
    body = red.fn.result
    if _times_zero(body, sc.vals, j):
        if sc.count != val_t.length:
            return None
    elif not (
        isinstance(body, ir.Select)
        and body.cond == ir.Binary(ops.LT.name, j, sc.count, body.cond.dtype)
        and _times_zero(body.a, sc.vals, j)
        and isinstance(body.b, ir.Const)
        and body.b.value == 0.0
    ):
        return None
    return SparseDecode(sc.idx.split(".", 1)[1], sc.vals.split(".", 1)[1], val_t.length, sc.count)
