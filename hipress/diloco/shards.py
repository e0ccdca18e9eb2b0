"""FSDP2 inside a replica: DiLoCo on each rank's shard of each parameter.

With ``fully_shard`` over the ranks of one replica, every trainable parameter is a DTensor
sharded on dim 0 (``Shard(0)`` on a 1-D mesh), and each rank holds rows of it. DiLoCo then
works on the local rows alone (:func:`local`), never on gathered parameters: the anchor, the
outer gradient (anchor shard - local shard), the codec with its error feedback, and the outer
optimizer's state are per shard, and the outer collective of a shard runs over the ranks of
the other replicas that hold the same rows (the ``process_group`` passed). :func:`layout`
says which rows a rank holds, so that construction can check that the group pairs equal
shards on every rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Shard

from hipress.diloco.errors import DiLoCoError

__all__ = ["as_grad", "check", "layout", "local", "mismatch", "rewrap_state"]


def local(p: torch.Tensor) -> torch.Tensor:
    """The rows of ``p`` this rank holds, detached, sharing ``p``'s storage (``p`` itself,
    detached, for a plain tensor): writing to it writes the parameter."""
    return p.to_local().detach() if isinstance(p, DTensor) else p.detach()


def check(named: Sequence[tuple[str, nn.Parameter]]) -> bool:
    """Whether the parameters are FSDP2 shards; raises :class:`DiLoCoError` if some are and
    others are not, or for another placement than ``Shard(0)`` on a 1-D mesh."""
    sharded = [n for n, p in named if isinstance(p, DTensor)]
    if not sharded:
        return False
    plain = [n for n, p in named if not isinstance(p, DTensor)]
    if plain:
        raise DiLoCoError(
            f"{plain[0]} is a plain tensor and {sharded[0]} a DTensor: with FSDP2 inside a "
            "replica every trainable parameter must be sharded (call fully_shard on the root "
            "module too)"
        )
    for n, p in named:
        mesh, places = p.device_mesh, tuple(p.placements)
        if mesh.ndim != 1 or places != (Shard(0),):
            raise DiLoCoError(
                f"{n} is a DTensor placed {places} on a {mesh.ndim}-D mesh: DiLoCo takes "
                "FSDP2 parameters sharded on dim 0 over the replica's ranks (Shard(0) on a 1-D "
                "mesh); for HSDP or tensor parallelism inside a replica, not supported"
            )
    return True


def layout(named: Sequence[tuple[str, nn.Parameter]]) -> list[tuple[str, tuple[int, ...], int, int]]:
    """Per DTensor parameter: its name, global shape and the rows ``[start, stop)`` this rank
    holds (FSDP2 splits dim 0 as ``torch.chunk`` does: the last ranks may hold fewer rows, or
    none). Empty for plain parameters."""
    out = []
    for n, p in named:
        if not isinstance(p, DTensor):
            continue
        rows, parts = p.shape[0], p.device_mesh.size()
        chunk = -(-rows // parts)
        start = min(p.device_mesh.get_local_rank() * chunk, rows)
        out.append((n, tuple(p.shape), start, start + p.to_local().shape[0]))
    return out


def as_grad(p: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """``flat`` (this rank's rows of ``p``, flattened) as a gradient for ``p``: a DTensor
    placed as ``p`` for a shard, else a tensor of ``p``'s shape and dtype."""
    if not isinstance(p, DTensor):
        return flat.view(p.shape).to(p.dtype)
    rows = flat.view(p.to_local().shape).to(p.dtype)
    return DTensor.from_local(rows, p.device_mesh, p.placements, run_check=False,
                              shape=p.shape, stride=p.stride())  # fmt: skip


def rewrap_state(opt: torch.optim.Optimizer) -> None:
    """After ``opt.load_state_dict`` of a state saved as local rows (a checkpoint keeps plain
    tensors): each state tensor of a DTensor parameter with the shape of its rows becomes a
    DTensor placed as the parameter again (scalars such as Adam's ``step`` stay plain)."""
    for p, state in opt.state.items():
        if not isinstance(p, DTensor):
            continue
        rows = p.to_local().shape
        for k, v in list(state.items()):
            if isinstance(v, torch.Tensor) and not isinstance(v, DTensor) and v.dim() and v.shape == rows:
                state[k] = as_grad(p, v.reshape(-1))


def mismatch(every: Sequence[Any]) -> str | None:
    """Given each group rank's :func:`layout`, the first rank whose shards differ from rank
    0's, described; None if every rank holds the same rows of the same parameters."""
    base = every[0]
    for r, mine in enumerate(every):
        if mine == base:
            continue
        if len(mine) != len(base):
            return f"rank {r} of the group has {len(mine)} sharded parameters, rank 0 {len(base)}"
        for (n, s, a, b), (n0, s0, a0, b0) in zip(mine, base, strict=True):
            if (n, s, a, b) != (n0, s0, a0, b0):
                return (f"{n0} {s0}: rank 0 of the group holds rows {a0}..{b0}, rank {r} holds "
                        f"{n} {s} rows {a}..{b}")  # fmt: skip
    return None
