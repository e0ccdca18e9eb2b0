"""tests/dist_utils.py: the multi-process launcher the distributed tests share."""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist
from dist_utils import WorkerError, run_workers


def _sum_ranks(rank: int, world_size: int, n: int) -> torch.Tensor:
    x = torch.full((n,), float(rank))
    dist.all_reduce(x)
    return x


def _fail_on_one(rank: int, world_size: int) -> int:
    if rank == 1:
        raise ValueError("rank one refuses")
    return os.getpid()


def _hang(rank: int, world_size: int) -> None:
    if rank == 0:
        time.sleep(60)  # never joins the barrier
    dist.barrier()


def test_results_come_back_in_rank_order() -> None:
    out = run_workers(_sum_ranks, 3, 5)
    assert [x.tolist() for x in out] == [[3.0] * 5] * 3


def test_a_failing_worker_reports_its_traceback() -> None:
    with pytest.raises(WorkerError, match=r"(?s)rank 1.*ValueError: rank one refuses"):
        run_workers(_fail_on_one, 2)


def test_a_hung_group_is_killed() -> None:
    with pytest.raises(WorkerError, match="still running"):
        run_workers(_hang, 2, timeout=3, pg_timeout=60)
