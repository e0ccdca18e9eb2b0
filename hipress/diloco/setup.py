"""The checks of a :class:`~hipress.diloco.DiLoCo` at construction: the optimizers against
the model's trainable parameters, the default outer optimizer, the agreement of every rank of
the group on the configuration (and, with FSDP2, on the shards it pairs), and the first
broadcast of the weights."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hipress.codec.logs import RANK_FILTER
from hipress.diloco import shards
from hipress.diloco.config import OUTER_PLAIN, outer_defaults
from hipress.diloco.errors import ConfigMismatchError, DiLoCoError
from hipress.diloco.sync import guarded

__all__ = ["agree", "broadcast_weights", "check_inner", "check_outer", "default_outer"]

log = logging.getLogger("hipress.diloco.diloco")
log.addFilter(RANK_FILTER)

Named = Sequence[tuple[str, nn.Parameter]]


def check_inner(named: Named, inner: torch.optim.Optimizer) -> None:
    """Raises :class:`DiLoCoError` if ``inner`` holds a tensor that is not in ``named``."""
    mine = {id(p) for _, p in named}
    for g in inner.param_groups:
        if any(id(p) not in mine for p in g["params"]):
            raise DiLoCoError(
                "inner_optimizer holds a parameter that is not one of the model's trainable "
                "parameters; build it over model.parameters()"
            )


def default_outer(named: Named, feedback: Sequence[str]) -> torch.optim.Optimizer:
    """The outer optimizer when none is given (over the parameters themselves, DTensors
    included: its state is then per shard)."""
    kw = outer_defaults(feedback)  # less momentum where a codec keeps error feedback
    if kw != OUTER_PLAIN:
        log.info("outer optimizer: Nesterov SGD %s (a codec keeps error feedback)", kw)
    # foreach: the same operations in the same order as the per-tensor loop (the same bits),
    # but Nesterov's step adds the momentum into the gradient in place instead of into a fresh
    # tensor the size of the parameters
    return torch.optim.SGD([p for _, p in named], **kw, foreach=True)


def check_outer(named: Named, outer: Any, inner: torch.optim.Optimizer) -> None:
    """Raises :class:`DiLoCoError` unless ``outer`` is another optimizer than ``inner``
    holding exactly the parameters of ``named``, each once."""
    if not isinstance(outer, torch.optim.Optimizer):
        raise DiLoCoError(
            f"outer_optimizer must be a torch.optim.Optimizer, got {type(outer).__name__}"
        )
    if outer is inner:
        raise DiLoCoError("outer_optimizer must be another optimizer than inner_optimizer")
    theirs = [id(p) for g in outer.param_groups for p in g["params"]]
    if sorted(theirs) != sorted(id(p) for _, p in named):
        raise DiLoCoError(
            "outer_optimizer must hold exactly the model's trainable parameters, each once "
            "(as torchft's): build it over model.parameters()"
        )


def agree(group: Any, config: str, lines: list[str], layout: list[Any]) -> None:
    """One all-gather of every rank's configuration digest, lines and shard layout; raises
    :class:`ConfigMismatchError` on every rank (they all see the same) if any differ."""
    every: list[Any] = [None] * dist.get_world_size(group)
    guarded(
        "the configuration check at construction",
        lambda: dist.all_gather_object(every, (config, lines, layout), group=group),
    )
    wrong = shards.mismatch([x for _, _, x in every])
    if wrong is not None:
        raise ConfigMismatchError(
            f"the process_group pairs different shards: {wrong}. With FSDP2 inside a replica, "
            "pass the group of the ranks that hold the same shard: shard rank i of every "
            "replica (the replica dimension of a 2-D DeviceMesh)"
        )
    if len({d for d, _, _ in every}) == 1:
        return
    base = every[0][1]
    out = []
    for r, (_, mine, _) in enumerate(every):
        diff = next((x for x in mine if x not in base), None)
        if diff is None and len(mine) != len(base):
            diff = f"{len(mine)} lines against rank 0's {len(base)}"
        out.append(f"  rank {r}: {'as rank 0' if diff is None else diff}")
    raise ConfigMismatchError(
        "DiLoCo ranks disagree; every rank must pass the same model, algorithm, parameters, "
        "fragments, schedule, seed and outer optimizer:\n" + "\n".join(out)
    )


def broadcast_weights(named: Named, group: Any) -> None:
    """Every rank of ``group`` takes the weights (its rows of them) of the group's rank 0."""
    src = dist.get_global_rank(group, 0) if group is not dist.group.WORLD else 0
    with torch.no_grad():
        for _, p in named:
            x = shards.local(p)
            guarded("the initial weight broadcast",
                    lambda x=x: dist.broadcast(x, src=src, group=group))  # fmt: skip
