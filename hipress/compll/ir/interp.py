"""The reference interpreter: executes the IR with torch ops, on any device.

This is the definition of what an algorithm computes; generated kernels are tested against it.
Each array operation is evaluated for all elements at once (a lambda runs on ``arange(len)``).
Values are kept in their compute dtype (:func:`hipress.compll.ir.types.torch_compute_dtype`):
integers as int64, packed arrays unpacked (one value per element).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from hipress.compll.ir import nodes as ir
from hipress.compll.ir import ops, semantics
from hipress.compll.ir.rng import philox_bits, uniform_from_bits
from hipress.compll.ir.types import BOOL, I64, DType, torch_compute_dtype


@dataclass
class Env:
    """Values during one run: host scalars (0-d), lambda values (1-d) and arrays."""

    scalars: dict[str, torch.Tensor] = field(default_factory=dict)
    arrays: dict[str, torch.Tensor] = field(default_factory=dict)
    seed: int = 0
    step: int = 0
    tensor_id: int = 0
    device: torch.device | None = None


def eval_scalar(e: ir.Expr, scalars: dict[str, torch.Tensor]) -> torch.Tensor:
    """Evaluate a host expression that reads no arrays (used for constant folding and sizes)."""
    return _eval(e, Env(scalars=scalars))


def eval_size(e: ir.Expr, n: int) -> int:
    """Evaluate an array-length expression for element count ``n``."""
    v = int(_eval(e, Env(scalars={ir.N: torch.tensor(n, dtype=torch.int64)})).item())
    return max(0, v)


def _eval(e: ir.Expr, env: Env) -> torch.Tensor:
    if isinstance(e, ir.Const):
        return semantics.const(e.value, e.dtype, env.device)
    if isinstance(e, ir.Ref):
        return env.scalars[e.name]
    if isinstance(e, ir.Load):
        arr = env.arrays[e.array]
        idx = _eval(e.index, env)
        n = arr.shape[0]
        if n == 0:
            return torch.zeros_like(idx, dtype=arr.dtype)
        ok = (idx >= 0) & (idx < n)
        vals = arr[torch.where(ok, idx, torch.zeros_like(idx))]
        return torch.where(ok, vals, torch.zeros((), dtype=arr.dtype, device=arr.device))
    if isinstance(e, ir.Unary):
        return semantics.unary(e.op, _eval(e.x, env), e.x.dtype)
    if isinstance(e, ir.Binary):
        return semantics.binary(e.op, _eval(e.a, env), _eval(e.b, env), e.a.dtype)
    if isinstance(e, ir.Select):
        return torch.where(_eval(e.cond, env), _eval(e.a, env), _eval(e.b, env))
    if isinstance(e, ir.Cast):
        return semantics.cast(_eval(e.x, env), e.x.dtype, e.dtype)
    if isinstance(e, ir.Rand):
        bits = philox_bits(_eval(e.counter, env), e.stream, env.step, env.tensor_id, env.seed)
        return uniform_from_bits(bits) if e.kind == "uniform" else bits
    raise TypeError(f"not an IR expression: {e!r}")


def _apply(fn: ir.Lambda, args: list[torch.Tensor], env: Env, length: int) -> torch.Tensor:
    for p, a in zip(fn.params, args, strict=True):
        env.scalars[p.name] = a
    for name, value in fn.lets:
        env.scalars[name] = _eval(value, env)
    out = _eval(fn.result, env)
    if out.dim() == 0:
        # a fresh dense copy: an expanded scalar of 0 or 1 elements counts as contiguous but
        # keeps stride 0, which the payload's byte views refuse
        return out.repeat(length)
    return out.contiguous() if out.shape[0] == length else out


def _index(length: int, env: Env) -> torch.Tensor:
    return torch.arange(length, dtype=torch.int64, device=env.device)


def _identity(op: str, dt: DType, device: torch.device | None) -> torch.Tensor:
    if op in (ops.REDUCE_SUM.name, ops.REDUCE_COUNT.name, ops.REDUCE_ABSMAX.name):
        return semantics.const(0, dt if op != ops.REDUCE_COUNT.name else I64, device)
    if op == ops.REDUCE_ANY.name:
        return semantics.const(False, BOOL, device)
    if op == ops.REDUCE_ALL.name:
        return semantics.const(True, BOOL, device)
    if dt.is_float:
        return semantics.const(
            float("inf") if op == ops.REDUCE_MIN.name else float("-inf"), dt, device
        )
    lo, hi = semantics.int_range(dt)
    return semantics.const(hi if op == ops.REDUCE_MIN.name else lo, dt, device)


def _reduce(op: ir.Reduce, env: Env) -> torch.Tensor:
    length = eval_size(op.length, _n(env))
    v = _apply(op.fn, [_index(length, env)], env, length)
    dt = op.fn.result.dtype
    if op.op == ops.REDUCE_CUSTOM.name:
        assert op.combine is not None and op.init is not None
        init = _eval(op.init, env)
        if length == 0:
            return init
        # pairwise tree: the contract is associativity and commutativity with init an identity
        while v.shape[0] > 1:
            if v.shape[0] % 2:
                v = torch.cat([v, init.reshape(1).to(v.dtype)])
            v = _apply(op.combine, [v[0::2], v[1::2]], env, v.shape[0] // 2)
        return _apply(op.combine, [init, v[0]], env, 1).reshape(())
    if length == 0:
        return _identity(op.op, op.dtype, env.device)
    if op.op == ops.REDUCE_SUM.name:
        if dt.is_float:
            return v.to(torch.float64).sum().to(torch_compute_dtype(op.dtype))
        return v.sum()
    if op.op == ops.REDUCE_COUNT.name:
        return v.to(torch.int64).sum()
    if op.op == ops.REDUCE_ANY.name:
        return v.any()
    if op.op == ops.REDUCE_ALL.name:
        return v.all()
    if op.op == ops.REDUCE_ABSMAX.name:
        v = semantics.unary(ops.ABS.name, v, dt)
    if dt.is_float and bool(torch.isnan(v).any()):
        return torch.tensor(float("nan"), dtype=v.dtype, device=v.device)
    if dt.is_float:
        # min/max over keys so that -0 < +0 regardless of order
        key = semantics.order_key(v, dt)
        pos = torch.argmin(key) if op.op == ops.REDUCE_MIN.name else torch.argmax(key)
        return v[pos]
    return v.min() if op.op == ops.REDUCE_MIN.name else v.max()


def _segreduce(op: ir.SegReduce, env: Env, n: int) -> torch.Tensor:
    length = eval_size(op.length, n)
    seg = max(1, eval_size(op.seg, n))
    v = _apply(op.fn, [_index(length, env)], env, length)
    dt = op.fn.result.dtype
    nseg = (length + seg - 1) // seg
    if nseg == 0:
        return torch.zeros(0, dtype=torch_compute_dtype(op.dtype), device=env.device)
    if op.op == ops.REDUCE_ABSMAX.name:
        v = semantics.unary(ops.ABS.name, v, dt)
    if op.op in (ops.REDUCE_COUNT.name, ops.REDUCE_SUM.name) and not dt.is_float:
        v = v.to(torch.int64)
    full = length // seg
    parts = []
    if full:
        parts.append(_segrows(op, v[: full * seg].reshape(full, seg), dt))
    if full < nseg:  # the short last segment, reduced on its own (cost O(length), not O(seg))
        parts.append(_segrows(op, v[full * seg :].reshape(1, -1), dt))
    return torch.cat(parts)


def _segrows(op: ir.SegReduce, rows: torch.Tensor, dt: DType) -> torch.Tensor:
    if op.op == ops.REDUCE_SUM.name:
        if dt.is_float:
            return rows.to(torch.float64).sum(1).to(torch_compute_dtype(op.dtype))
        return rows.sum(1)
    if op.op == ops.REDUCE_COUNT.name:
        return rows.sum(1)
    if op.op == ops.REDUCE_ANY.name:
        return rows.any(1)
    if op.op == ops.REDUCE_ALL.name:
        return rows.all(1)
    if not dt.is_float:
        return rows.min(1).values if op.op == ops.REDUCE_MIN.name else rows.max(1).values
    key = semantics.order_key(rows, dt)
    pos = torch.argmin(key, 1) if op.op == ops.REDUCE_MIN.name else torch.argmax(key, 1)
    out = rows.gather(1, pos.reshape(-1, 1)).reshape(-1)
    hasnan = torch.isnan(rows).any(1)
    return torch.where(hasnan, torch.full_like(out, float("nan")), out)


def _n(env: Env) -> int:
    return int(env.scalars[ir.N].item())


def run(ops: tuple[ir.Op, ...], env: Env, state_out: dict[str, torch.Tensor]) -> None:
    """Execute host ``ops`` in ``env``; state writes go to ``state_out``."""
    n = _n(env)
    for op in ops:
        if isinstance(op, ir.Let):
            env.scalars[op.name] = _eval(op.value, env)
        elif isinstance(op, ir.Map):
            length = eval_size(op.type.length, n)
            env.arrays[op.name] = _apply(op.fn, [_index(length, env)], env, length)
        elif isinstance(op, ir.Reduce):
            env.scalars[op.name] = _reduce(op, env)
        elif isinstance(op, ir.SegReduce):
            env.arrays[op.name] = _segreduce(op, env, n)
        elif isinstance(op, ir.Filter):
            length = eval_size(op.length, n)
            bound = eval_size(op.bound, n)
            pred = _apply(op.pred, [_index(length, env)], env, length)
            idx = torch.nonzero(pred).reshape(-1)[:bound]
            out = torch.zeros(bound, dtype=torch.int64, device=env.device)
            out[: idx.shape[0]] = idx
            env.arrays[op.idx] = out
            env.scalars[op.count] = torch.tensor(idx.shape[0], dtype=torch.int64)
        elif isinstance(op, ir.TopK):
            length = eval_size(op.length, n)
            k = eval_size(op.k, n)
            keys = _apply(op.key, [_index(length, env)], env, length)
            order = torch.argsort(
                semantics.order_key(keys, op.key.result.dtype), descending=True, stable=True
            )
            take = torch.sort(order[: min(k, length)]).values
            out = torch.zeros(k, dtype=torch.int64, device=env.device)
            out[: take.shape[0]] = take
            env.arrays[op.idx] = out
            env.scalars[op.count] = torch.tensor(take.shape[0], dtype=torch.int64)
        elif isinstance(op, ir.Sort):
            length = eval_size(op.length, n)
            vals = _apply(op.key, [_index(length, env)], env, length)
            order = torch.argsort(semantics.order_key(vals, op.dtype), stable=True)
            env.arrays[op.name] = vals[order]
        elif isinstance(op, ir.Scan):
            env.arrays[op.name] = _scan(op, env, n)
        elif isinstance(op, ir.Scatter):
            env.arrays[op.name] = _scatter(op, env, n)
        elif isinstance(op, ir.Block):  # its masked reads are the block-local semantics
            run(op.ops, env, state_out)
        elif isinstance(op, ir.StoreState):
            if isinstance(op.value, str):
                state_out[op.state] = env.arrays[op.value]
            else:
                state_out[op.state] = _eval(op.value, env)
        else:  # pragma: no cover
            raise TypeError(op)


def _scatter(op: ir.Scatter, env: Env, n: int) -> torch.Tensor:
    length = eval_size(op.length, n)
    cdt = torch_compute_dtype(op.dtype)
    if op.base is not None:
        out = env.arrays[op.base].clone()
    else:
        out = torch.zeros(length, dtype=cdt, device=env.device)
    idx = env.arrays[op.idx]
    vals = env.arrays[op.vals]
    count = int(_eval(op.count, env).item())
    j = torch.arange(idx.shape[0], device=env.device)
    ok = (j < count) & (idx >= 0) & (idx < length)
    if op.mode == "set":
        # the last j at each index wins: its j is the largest (-1: no value lands there)
        last = torch.full((length,), -1, dtype=torch.int64, device=env.device)
        last.scatter_reduce_(0, idx[ok].long(), j[ok], "amax")
        hit = last >= 0
        out[hit] = vals[last[hit]].to(out.dtype)
    elif op.dtype.is_int:  # (wrapping sums do not depend on the order)
        out.index_put_((idx[ok],), vals[ok], accumulate=True)
        out = semantics.wrap(out, op.dtype)
    else:
        _scatter_in_order(out, idx[ok], vals[ok])
    return out


def _scatter_in_order(out: torch.Tensor, idx: torch.Tensor, vals: torch.Tensor) -> None:
    """``out[idx[j]] += vals[j]`` for j in ascending order, one rounded add at a time: the
    language's order of a float scatter. Round r adds each index's r-th value, so no index
    repeats within a round."""
    if idx.numel() == 0:
        return
    if out.dtype in (torch.float32, torch.float64):
        # numpy's unbuffered add.at adds in index-array order, each add rounded in out's type
        host = out.cpu().numpy()
        np.add.at(host, idx.cpu().numpy(), vals.to(out.dtype).cpu().numpy())
        out.copy_(torch.from_numpy(host))
        return
    order = torch.sort(idx, stable=True).indices
    s = idx[order]
    pos = torch.arange(s.numel(), device=s.device)
    first = torch.ones_like(s, dtype=torch.bool)
    first[1:] = s[1:] != s[:-1]
    start = torch.where(first, pos, torch.zeros_like(pos)).cummax(0).values
    rank = torch.empty_like(pos)
    rank[order] = pos - start  # how many values at the same index come before j
    by_round = torch.sort(rank, stable=True).indices
    ends = torch.bincount(rank).cumsum(0).tolist()
    lo = 0
    for hi in ends:
        sel = by_round[lo:hi]
        out.index_put_((idx[sel],), vals[sel], accumulate=True)
        lo = hi


def _scan(op: ir.Scan, env: Env, n: int) -> torch.Tensor:
    length = eval_size(op.length, n)
    v = _apply(op.fn, [_index(length, env)], env, length)
    if op.op == ops.REDUCE_SUM.name:
        if op.dtype.is_float:
            return torch.cumsum(v.to(torch.float64), 0).to(torch_compute_dtype(op.dtype))
        return torch.cumsum(v, 0)
    # Hillis-Steele with the exact min/max semantics
    combiner = ops.REDUCE[op.op].combiner
    assert combiner is not None
    out = v.clone()
    shift = 1
    while shift < length:
        prev = out[:-shift]
        joined = semantics.binary(combiner, prev, out[shift:], op.dtype)
        out = torch.cat([out[:shift], joined])
        shift *= 2
    return out
