"""Row-sparse synchronisation of one 2-D gradient whose rows are mostly exact zeros (a plain
``nn.Embedding``'s): only the rows holding a non-zero travel, as indices and values.

A plan entry with ``row_bound > 0`` (:class:`~hipress.core.plan.TensorPlan`) is run here, in
two collectives, both issued on the hook's thread in the same order on every rank:

1. Indices: each rank all-gathers a block of ``row_bound + 1`` int64: how many rows it touched,
   then their indices (when no more than the bound). Every rank then knows every rank's count
   and the union ``U`` of the touched rows, sorted, so every rank takes the same decision.
2. Values, one of:

   - dense fallback (a rank touched more than ``row_bound`` rows): the tensor is allreduced
     whole, uncompressed (compressed mode: with its residual added, which is then zero);
   - nothing (no rank touched a row): the tensor stays zero;
   - exact (``compress`` false), whichever puts fewer bytes on each rank's link (every rank
     decides alike, :func:`~hipress.core.plan.gather_own`): the ``|U|`` rows are allreduced,
     or each rank's own rows are all-gathered (padded to the largest count) and summed into
     ``U`` in rank order; either way a row touched by several ranks is summed once per rank,
     rows outside ``U`` are zero on every rank, and every rank holds the same bits;
   - compressed (``compress`` true): each rank encodes its ``|U|`` rows plus their residual
     with the tensor's algorithm, the payloads (one size on every rank: ``|U|`` is agreed) are
     all-gathered and their decodes averaged.

Error feedback in compressed mode is kept here, per element, in a :class:`RowState` (a worker
state under key ``name#rows``, saved and restored with the other chunk states): after encoding
``c = rows + residual[U]``, ``residual[U] = c - decode(own payload)``. The rows outside ``U``
keep their residual as it is: it waits until a step touches the row again (on any rank), as
a sparsifier's residual waits until its element is selected. The algorithm runs on a fresh
state every step (its RNG counter is the row state's step), so the residual is not counted
twice by an algorithm that keeps its own.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from hipress.casync.strategies.context import all_gather
from hipress.casync.strategies.surface import Group, Operation
from hipress.codec.algorithm import decode_mean
from hipress.codec.rowsparse import (
    RowState,
    encode_rows,
    nonzero_rows,
    own_rows,
    row_state_key,
    sum_rows,
)
from hipress.core.plan import TensorPlan, gather_own

__all__ = ["start"]


def start(op: Operation, offset: int, entry: TensorPlan, group: Group) -> None:
    """Find the rows of ``entry`` (at element ``offset`` of the bucket) this rank touched and
    all-gather their indices; the values follow in :meth:`advance` (:func:`_values`)."""
    n, bound = op.ctx.world_size, entry.row_bound
    grad = op.buffer[offset : offset + entry.numel].view(entry.rows, -1)
    with op.ctx.stats.timed("encode_ms"):
        touched = nonzero_rows(grad)
        msg = torch.full((bound + 1,), -1, dtype=torch.int64, device=grad.device)
        msg[0] = touched.numel()
        if touched.numel() <= bound:
            msg[1 : 1 + touched.numel()] = touched
    recv = torch.empty(n * (bound + 1), dtype=torch.int64, device=grad.device)
    op.defer(
        lambda: all_gather(recv, msg, group=group, async_op=True),
        msg.numel() * 8, "rows: indices", lambda g: _values(op, grad, entry, recv, g),
    )  # fmt: skip


def _values(op: Operation, grad: torch.Tensor, entry: TensorPlan, recv: torch.Tensor,
            group: Group) -> None:  # fmt: skip
    """The indices arrived: synchronise the values (see the module docstring)."""
    ctx, n, bound = op.ctx, op.ctx.world_size, entry.row_bound
    blocks = recv.view(n, bound + 1)
    state = ctx.worker_states.get(row_state_key(entry.name)) if entry.compress else None
    most = int(blocks[:, 0].max())
    if most > bound:
        _dense(op, grad, state, group)
        return
    idx = blocks[:, 1:]
    union = torch.unique(idx[idx >= 0])  # sorted
    if union.numel() == 0:
        op.part_done()
        return
    if state is None and gather_own(n, most, union.numel()):
        _gather_own(op, grad, blocks, most, union, group)
        return
    with ctx.stats.timed("encode_ms"):
        rows = grad.index_select(0, union)
    if state is None:
        rows.div_(n)
        op.issue(
            lambda: dist.all_reduce(rows, group=group, async_op=True),
            rows.numel() * rows.element_size(), "rows: allreduce", _scatter, op, grad, union, rows,
        )  # fmt: skip
        return
    payload = _encode(op, grad, union, rows.float(), state)
    out = torch.empty(n * payload.numel(), dtype=torch.uint8, device=grad.device)
    op.issue(
        lambda: all_gather(out, payload, group=group, async_op=True),
        payload.numel(), "rows: allgather", _decode, op, grad, union, out,
    )  # fmt: skip


def _gather_own(op: Operation, grad: torch.Tensor, blocks: torch.Tensor, most: int,
                union: torch.Tensor, group: Group) -> None:  # fmt: skip
    """Exact rows as each rank's own: all-gather them (scaled by 1/N, padded to the largest
    count), then sum them into the union's rows in rank order (:func:`_sum_own`)."""
    n, rank = op.ctx.world_size, op.ctx.rank
    mine = int(blocks[rank, 0])
    with op.ctx.stats.timed("encode_ms"):
        own = own_rows(grad, blocks[rank, 1 : 1 + mine], most, grad.dtype).div_(n)
    out = torch.empty(n * own.numel(), dtype=grad.dtype, device=grad.device)
    op.issue(
        lambda: all_gather(out, own.view(-1), group=group, async_op=True),
        own.numel() * own.element_size(), "rows: allgather own", _sum_own, op, grad,
        blocks, union, out.view(n, most, -1),
    )  # fmt: skip


def _sum_own(op: Operation, grad: torch.Tensor, blocks: torch.Tensor, union: torch.Tensor,
             got: torch.Tensor) -> None:  # fmt: skip
    """Rank ``r``'s rows ``got[r]`` arrived: the union's rows are their sum
    (:func:`~hipress.codec.rowsparse.sum_rows`: on two ranks DDP's bits)."""
    counts = blocks[:, 0].tolist()
    with op.ctx.stats.timed("decode_ms"):
        acc = sum_rows(union, [blocks[r, 1 : 1 + c] for r, c in enumerate(counts)], got)
        grad.index_copy_(0, union, acc)
    op.part_done()


def _dense(op: Operation, grad: torch.Tensor, state: RowState | None, group: Group) -> None:
    """A step denser than the bound: allreduce the whole tensor (plus its residual, then zero)."""
    flat = grad.view(-1)
    if state is not None:
        res = state.tensors["residual"]
        flat.add_(res.to(flat.dtype))
        res.zero_()
    flat.div_(op.ctx.world_size)
    op.issue(
        lambda: dist.all_reduce(flat, group=group, async_op=True),
        flat.numel() * flat.element_size(), "rows: dense fallback", op.part_done,
    )  # fmt: skip


def _scatter(op: Operation, grad: torch.Tensor, union: torch.Tensor, rows: torch.Tensor) -> None:
    with op.ctx.stats.timed("decode_ms"):
        grad.index_copy_(0, union, rows)
    op.part_done()


def _encode(
    op: Operation, grad: torch.Tensor, union: torch.Tensor, rows: torch.Tensor, state: RowState
) -> torch.Tensor:
    with op.ctx.stats.timed("encode_ms"):
        return encode_rows(op.ctx.algorithm, rows, union, state)


def _decode(op: Operation, grad: torch.Tensor, union: torch.Tensor, out: torch.Tensor) -> None:
    ctx, n = op.ctx, op.ctx.world_size
    k, size = union.numel() * grad.shape[1], out.numel() // n
    with ctx.stats.timed("decode_ms"):
        mean = torch.empty(k, dtype=torch.float32, device=grad.device)
        decode_mean(ctx.algorithm, [out[r * size : (r + 1) * size] for r in range(n)], k, mean)
        grad.index_copy_(0, union, mean.view(-1, grad.shape[1]).to(grad.dtype))
    op.part_done()
