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
   - exact (``compress`` false): the ``|U|`` rows are allreduced; a row touched by several
     ranks is summed once per rank, rows outside ``U`` are zero on every rank;
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

import zlib
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from hipress.casync.strategies.context import all_gather
from hipress.casync.strategies.surface import Group, Operation
from hipress.codec.algorithm import decode_mean, rank_seed
from hipress.core.plan import Plan, TensorPlan

__all__ = ["RowState", "row_state_key", "row_states", "start"]


def row_state_key(name: str) -> str:
    """The worker-state key of compressed row-sparse parameter ``name``."""
    return f"{name}#rows"


class RowState:
    """Error feedback of one compressed row-sparse tensor: ``tensors["residual"]`` (float32,
    one per element), ``step`` (encodes so far), and the RNG key and stream the algorithm draws
    from. Checkpoints like an algorithm state (``state_dict`` / ``load_state_dict``)."""

    def __init__(self, n: int, device: torch.device, seed: int, tensor_id: int) -> None:
        self.n = n
        self.tensors = {"residual": torch.zeros(n, dtype=torch.float32, device=device)}
        self.step = 0
        self.seed = seed
        self.tensor_id = tensor_id

    def state_dict(self) -> dict[str, Any]:
        return {"n": self.n, "step": self.step, "seed": self.seed, "tensor_id": self.tensor_id,
                "tensors": {k: v.detach().cpu().clone() for k, v in self.tensors.items()}}  # fmt: skip

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        if not isinstance(sd, Mapping) or not isinstance(sd.get("tensors"), Mapping):
            raise ValueError("a row state dict is a dict with `tensors`")
        for key in ("n", "step", "seed", "tensor_id"):
            v = sd.get(key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"row state entry `{key}` must be an integer >= 0, got {v!r}")
        if sd["n"] != self.n:
            raise ValueError(f"row state is for {sd['n']} elements, this tensor has {self.n}")
        res = sd["tensors"].get("residual")
        if (
            not isinstance(res, torch.Tensor)
            or res.shape != (self.n,)
            or set(sd["tensors"]) != {"residual"}
        ):
            raise ValueError(f"row state entry `residual` must be a tensor of {self.n} elements")
        self.tensors["residual"].copy_(res)
        self.step, self.seed, self.tensor_id = sd["step"], sd["seed"], sd["tensor_id"]

    def reset(self) -> None:
        self.tensors["residual"].zero_()

    def reset_where(self, flag: torch.Tensor) -> None:
        self.tensors["residual"].masked_fill_(flag, 0)


def row_states(
    plan: Plan, rank: int, seed: int, devices: Mapping[str, torch.device]
) -> dict[str, RowState]:
    """The all-zero row states rank ``rank`` keeps under ``plan`` (compressed row-sparse
    entries only), by key."""
    out = {}
    for e in plan.entries:
        if e.row_bound and e.compress:
            key = row_state_key(e.name)
            device = devices.get(e.name, torch.device("cpu"))
            out[key] = RowState(e.numel, device, rank_seed(seed, rank), zlib.crc32(key.encode()))
    return out


def start(op: Operation, offset: int, entry: TensorPlan, group: Group) -> None:
    """Find the rows of ``entry`` (at element ``offset`` of the bucket) this rank touched and
    all-gather their indices; the values follow in :meth:`advance` (:func:`_values`)."""
    n, bound = op.ctx.world_size, entry.row_bound
    grad = op.buffer[offset : offset + entry.numel].view(entry.rows, -1)
    with op.ctx.stats.timed("encode_ms"):
        touched = _nonzero_rows(grad)
        msg = torch.full((bound + 1,), -1, dtype=torch.int64, device=grad.device)
        msg[0] = touched.numel()
        if touched.numel() <= bound:
            msg[1 : 1 + touched.numel()] = touched
    recv = torch.empty(n * (bound + 1), dtype=torch.int64, device=grad.device)
    op.defer(
        lambda: all_gather(recv, msg, group=group, async_op=True),
        msg.numel() * 8, "rows: indices", lambda g: _values(op, grad, entry, recv, g),
    )  # fmt: skip


def _nonzero_rows(grad: torch.Tensor) -> torch.Tensor:
    """The indices of the rows of ``grad`` holding a bit that is not zero, ascending (-0.0
    counts as touched, NaN too): read as 64-bit words where the layout allows (one pass, 2-3x
    faster than comparing floats), else as values."""
    words = grad.element_size() * grad.shape[1]
    if grad.is_contiguous() and words % 8 == 0 and grad.data_ptr() % 8 == 0:
        flags = grad.view(torch.uint8).view(torch.int64).any(1)
    else:
        flags = grad.ne(0).any(1)
    return flags.nonzero().flatten()


def _values(op: Operation, grad: torch.Tensor, entry: TensorPlan, recv: torch.Tensor,
            group: Group) -> None:  # fmt: skip
    """The indices arrived: synchronise the values (see the module docstring)."""
    ctx, n, bound = op.ctx, op.ctx.world_size, entry.row_bound
    blocks = recv.view(n, bound + 1)
    state = ctx.worker_states.get(row_state_key(entry.name)) if entry.compress else None
    if int(blocks[:, 0].max()) > bound:
        _dense(op, grad, state, group)
        return
    idx = blocks[:, 1:]
    union = torch.unique(idx[idx >= 0])  # sorted
    if union.numel() == 0:
        op.part_done()
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
    """Encode ``rows`` (float32) plus their residual; the residual becomes what the payload
    leaves out (zero where the rows are not finite, so error feedback is not poisoned)."""
    alg, width = op.ctx.algorithm, grad.shape[1]
    res = state.tensors["residual"].view(-1, width)
    with op.ctx.stats.timed("encode_ms"):
        c = rows.add_(res.index_select(0, union)).view(-1)
        k = c.numel()
        st = alg.init_state(k, device=grad.device, seed=state.seed, tensor_id=state.tensor_id)
        st.step = state.step
        payload = torch.zeros(alg.payload_nbytes(k), dtype=torch.uint8, device=grad.device)
        alg.encode(c, st, out=payload)
        state.step += 1
        left = c - alg.decode(payload, k)
        if not bool(torch.isfinite(c).all()):
            left.zero_()
        res.index_copy_(0, union, left.view(-1, width))
    return payload


def _decode(op: Operation, grad: torch.Tensor, union: torch.Tensor, out: torch.Tensor) -> None:
    ctx, n = op.ctx, op.ctx.world_size
    k, size = union.numel() * grad.shape[1], out.numel() // n
    with ctx.stats.timed("decode_ms"):
        mean = torch.empty(k, dtype=torch.float32, device=grad.device)
        decode_mean(ctx.algorithm, [out[r * size : (r + 1) * size] for r in range(n)], k, mean)
        grad.index_copy_(0, union, mean.view(-1, grad.shape[1]).to(grad.dtype))
    op.part_done()
