"""What :func:`hipress.fsdp.register` checks across ranks before the first compressed
collective, in real 2-process gloo runs: every rank registers the same configuration, and a
``replicate_group`` holds the replicas of this rank's shards."""

from __future__ import annotations

import torch.distributed as dist
from dist_utils import run_workers
from fsdp_workers import grid_model, shard

import hipress.fsdp
from hipress.fsdp import FsdpError

PRELOAD = ("torch", "torch.distributed", "torch.distributed.fsdp", "hipress.fsdp", "fsdp_workers")


def replicate_with_the_shard_group(rank: int, world_size: int) -> str:
    """register's error for replicate_group = the group the model is sharded on."""
    try:
        hipress.fsdp.register(shard(grid_model()), "fp16", min_compress_numel=1,
                              replicate_group=dist.group.WORLD)  # fmt: skip
    except FsdpError as exc:
        return str(exc)
    return "accepted"


def test_a_replicate_group_that_is_the_shard_group_is_refused() -> None:
    for msg in run_workers(replicate_with_the_shard_group, 2, preload=PRELOAD, timeout=120):
        assert "shares ranks [0, 1] with" in msg, msg
        assert "mesh['replicate'].get_group()" in msg
