"""Row-sparse synchronisation over Horovod (see ``hipress.casync.strategies.rowsparse`` for the
scheme): a plan entry with ``row_bound > 0`` sends only the rows of its gradient that hold a
non-zero.

Phase 1 all-gathers ``[count, indices...]`` of every rank (Horovod's all-gather takes uneven
sizes); every rank then knows every count and the sorted union of the touched rows. Phase 2 is
a dense allreduce when a rank touched more than ``row_bound`` rows, nothing when no rank
touched a row, exact: an allreduce (Average) of the union's rows or, where that sends fewer
bytes (:func:`~hipress.core.plan.gather_own`), an all-gather of each rank's own rows (padded
to the largest count) summed in rank order (:func:`~hipress.codec.rowsparse.sum_rows`), or,
compressed, an all-gather of their payloads encoded with the algorithm against a per-row
residual (:func:`~hipress.codec.rowsparse.encode_rows`). Horovod matches operations by name,
so each phase has a name of its own per parameter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from hipress.codec.algorithm import decode_mean
from hipress.codec.rowsparse import (
    encode_rows,
    nonzero_rows,
    own_rows,
    row_state_key,
    sum_rows,
)
from hipress.core.plan import TensorPlan, gather_own

__all__ = ["RowOp", "advance", "finish", "start"]


@dataclass
class RowOp:
    """One row-sparse parameter in flight: its phase, handle, and (phase 2) what came of it."""

    handle: Any
    phase: int = 1
    mode: str = "indices"  # then "dense", "none", "exact", "own" or "compressed"
    union: torch.Tensor | None = None
    nbytes: int = 0
    indices: list[torch.Tensor] = field(default_factory=list)  # "own": each rank's rows


def start(hvd: Any, name: str, grad: torch.Tensor) -> RowOp:
    """Issue phase 1 for ``grad`` (not modified)."""
    touched = nonzero_rows(grad.reshape(grad.shape[0], -1))
    msg = torch.cat([torch.tensor([touched.numel()], device=grad.device), touched])
    return RowOp(hvd.allgather_async(msg, name=f"hipress.rs1.{name}"))


def advance(hvd: Any, sync: Any, name: str, entry: TensorPlan, grad: torch.Tensor,
            op: RowOp) -> None:  # fmt: skip
    """Wait for phase 1 and issue phase 2 (a no-op once done)."""
    if op.phase != 1:
        return
    op.phase = 2
    got = hvd.synchronize(op.handle)
    counts, idx, pos = [], [], 0
    while pos < got.numel():  # [count, indices...] of each rank, in rank order
        k = int(got[pos])
        counts.append(k)
        idx.append(got[pos + 1 : pos + 1 + k])
        pos += 1 + k
    flat = grad.reshape(entry.rows, -1)
    state = sync.worker_states.get(row_state_key(name)) if entry.compress else None
    if max(counts) > entry.row_bound:
        dense = flat.float() + (state.tensors["residual"].view_as(flat) if state else 0)
        if state is not None:
            state.reset()
        op.mode = "dense"
        op.handle = hvd.allreduce_async_(dense, name=f"hipress.rs2.{name}", op=hvd.Average)
        return
    op.union = torch.unique(torch.cat(idx))
    if op.union.numel() == 0:
        op.mode = "none"
        return
    if state is None and gather_own(len(counts), max(counts), op.union.numel()):
        op.mode, op.indices = "own", idx
        own = own_rows(flat, idx[sync.rank], max(counts), torch.float32)
        op.handle = hvd.allgather_async(own, name=f"hipress.rs2.{name}")
        return
    rows = flat.index_select(0, op.union).float()
    if state is None:
        op.mode = "exact"
        op.handle = hvd.allreduce_async_(rows, name=f"hipress.rs2.{name}", op=hvd.Average)
        return
    payload = encode_rows(sync.algorithm, rows, op.union, state)
    op.mode, op.nbytes = "compressed", payload.numel()
    op.handle = hvd.allgather_async(payload, name=f"hipress.rs2.{name}")


def finish(hvd: Any, sync: Any, name: str, entry: TensorPlan, grad: torch.Tensor,
           op: RowOp) -> torch.Tensor:  # fmt: skip
    """Wait for phase 2; the synchronised gradient (shape and dtype of ``grad``)."""
    advance(hvd, sync, name, entry, grad, op)
    if op.mode == "dense":
        return hvd.synchronize(op.handle).to(grad.dtype).view_as(grad)
    out = torch.zeros(entry.rows, entry.numel // entry.rows, dtype=torch.float32,
                      device=grad.device)  # fmt: skip
    if op.mode == "exact":
        out.index_copy_(0, op.union, hvd.synchronize(op.handle))
    elif op.mode == "own":
        got = hvd.synchronize(op.handle).view(sync.world_size, -1, out.shape[1])
        out.index_copy_(0, op.union, sum_rows(op.union, op.indices, got).div_(sync.world_size))
    elif op.mode == "compressed":
        got, n = hvd.synchronize(op.handle), sync.world_size
        k = op.union.numel() * out.shape[1]
        mean = torch.empty(k, dtype=torch.float32, device=grad.device)
        payloads = [got[r * op.nbytes : (r + 1) * op.nbytes] for r in range(n)]
        decode_mean(sync.algorithm, payloads, k, mean)
        out.index_copy_(0, op.union, mean.view(-1, out.shape[1]))
    return out.to(grad.dtype).view_as(grad)
