"""hipress.core.torchcompat: each call spelt once for every supported torch. The collectives
run in real 2-process gloo groups; the suite runs under the newest torch (``./run test``) and
the oldest declared one (``.ci/oldest-torch.sh``), so both spellings are exercised."""

from __future__ import annotations

import pickle
import warnings
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist
from dist_utils import run_workers
from torch import nn

from hipress.core.torchcompat import (
    fsdp_param_groups,
    make_premul_sum,
    premul_sum_factor,
    reduce_scatter_single,
)

PRELOAD = ("torch", "torch.distributed", "torch.distributed.fsdp", "hipress.core.torchcompat")


def _reduce_scatter(rank: int, world_size: int) -> dict[str, Any]:
    inp = torch.arange(world_size * 3, dtype=torch.float32) + 10 * rank
    out = torch.empty(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no deprecated spelling where a current one exists
        assert reduce_scatter_single(out, inp) is None
        out_async = torch.empty(3)
        work = reduce_scatter_single(out_async, inp, dist.group.WORLD, dist.ReduceOp.MAX, True)
    work.wait()
    return {"sum": out, "max": out_async}


def test_reduce_scatter_single_sums_rows_and_returns_work_when_async() -> None:
    for rank, got in enumerate(run_workers(_reduce_scatter, 2, preload=PRELOAD)):
        row = torch.arange(3 * rank, 3 * rank + 3, dtype=torch.float32)
        assert torch.equal(got["sum"], 2 * row + 10)  # rank 0 adds 0, rank 1 adds 10
        assert torch.equal(got["max"], row + 10)


@pytest.mark.parametrize("factor", [0.25, 3, torch.tensor(0.5)])
def test_premul_sum_factor_reads_back_what_make_premul_sum_built(factor: Any) -> None:
    op = make_premul_sum(factor)
    assert op.op == dist.ReduceOp.PREMUL_SUM
    for o in (op, pickle.loads(pickle.dumps(op))):  # FSDP2 may hand over a copy
        got = premul_sum_factor(o)
        if isinstance(factor, torch.Tensor):
            assert isinstance(got, torch.Tensor) and torch.equal(got, factor)
        else:
            assert got == factor


def test_premul_sum_factor_reads_torchs_own_premul_sum() -> None:
    # what FSDP2 builds for a gradient divide factor, in every supported torch
    assert premul_sum_factor(dist._make_nccl_premul_sum(0.125)) == 0.125


@pytest.mark.parametrize(
    "op",
    [
        dist.ReduceOp.SUM,
        dist.ReduceOp.AVG,
        dist.ReduceOp(dist.ReduceOp.SUM),
        dist.ReduceOp.PREMUL_SUM,  # the bare member carries no factor
        "premul_sum",
        None,
    ],
)
def test_premul_sum_factor_is_none_for_other_ops(op: Any) -> None:
    assert premul_sum_factor(op) is None


def test_fsdp_param_groups_reads_either_layout_of_the_state() -> None:
    # the two layouts FSDPState has had: a list of groups, or one group (None without params)
    a, b = object(), object()
    assert fsdp_param_groups(SimpleNamespace(_fsdp_param_groups=[a, b])) == [a, b]
    assert fsdp_param_groups(SimpleNamespace(_fsdp_param_groups=[])) == []
    assert fsdp_param_groups(SimpleNamespace(_fsdp_param_group=a)) == [a]
    assert fsdp_param_groups(SimpleNamespace(_fsdp_param_group=None)) == []


def _param_groups(rank: int, world_size: int) -> dict[str, Any]:
    from torch.distributed.fsdp import FSDPModule, fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Sequential(nn.ReLU()), nn.Linear(6, 2))
    for child in model:
        fully_shard(child)
    fully_shard(model)
    model(torch.ones(1, 4)).sum().backward()  # FSDP2 builds its groups lazily
    out = {}
    for name, m in model.named_modules():
        if isinstance(m, FSDPModule):
            groups = fsdp_param_groups(m._get_fsdp_state())
            out[name or "<root>"] = [[fp.sharded_param.to_local().numel() for fp in g.fsdp_params]
                                     for g in groups]  # fmt: skip
    return out


def test_fsdp_param_groups_of_real_fsdp2_units() -> None:
    for got in run_workers(_param_groups, 2, preload=PRELOAD):
        # each Linear is a unit of one group (weight and bias sharded over 2 ranks); the ReLU
        # and the root own no parameters
        assert got == {"<root>": [], "0": [[12, 3]], "1": [], "2": [[6, 1]]}
