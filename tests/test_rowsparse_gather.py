"""Exact row-sparse rows travel either as the union allreduced or as each rank's own rows
all-gathered, whichever sends fewer bytes: both against DDP's allreduce on real gloo groups of
2 and 4, with counts that differ between ranks (padding), rows shared by every rank, signed
zeros in the rows (bit for bit against DDP at 2: -0.0 where two ranks' -0.0 meet, +0.0 where
a rank adds its untouched +0.0), and every rank left holding the same bits."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from dist_utils import run_workers
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from hipress.casync import register
from hipress.core.plan import Plan, Strategy, TensorPlan, gather_own

ROWS, DIM, BOUND = 96, 6, 12


class _Net(nn.Module):
    """A table whose gradient is exactly ``M`` (its touched rows and their bits are the test's
    to choose, -0.0 included), sharing DDP's bucket with a dense layer."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.table = nn.Parameter(torch.randn(ROWS, DIM))
        self.out = nn.Linear(DIM, 3)

    def forward(self, m: torch.Tensor) -> torch.Tensor:
        return (self.table * m).sum() + self.out(m[:4]).square().sum()


def _grad_rows(tok: list[int], rank: int) -> torch.Tensor:
    """``M``: the rows ``tok`` hold -0.0 in dims 0 and 1 (a row shared by two ranks then sums
    to -0.0 there, a row of one rank to +0.0), +0.0 in dim 2, and values in the rest."""
    m = torch.zeros(ROWS, DIM)
    for i in tok:
        m[i] = torch.tensor([-0.0, -0.0, 0.0, 1.0 + i, -0.25 * (rank + 1), 3.0 / (i + 1)])
    return m


def _tokens(mode: str, step: int, rank: int) -> list[int]:
    """``own``: row 0 on every rank, then ``rank + 1 + step`` rows of its own (the ranks'
    counts differ); ``union``: the same 5 rows on every rank, one of them only on rank 0."""
    if mode == "own":
        return [0] + [20 + 10 * rank + j for j in range(rank + 1 + step)]
    return [1, 2, 3, 4] + ([5] if rank == 0 else [])


def _plan(n: int) -> Plan:
    return Plan("onebit", {}, n, (
        TensorPlan("table", ROWS * DIM, False, Strategy.ALLREDUCE, rows=ROWS, row_bound=BOUND),
        TensorPlan("out.weight", DIM * 3, False, Strategy.ALLREDUCE),
        TensorPlan("out.bias", 3, False, Strategy.ALLREDUCE),
    ))  # fmt: skip


def _step(model: nn.Module, ddp: nn.Module, tok: list[int], rank: int) -> torch.Tensor:
    model.zero_grad()
    ddp(_grad_rows(tok, rank)).backward()
    return model.table.grad.clone()


def _run(rank: int, n: int, mode: str) -> list[tuple[bool, bool, bool, bool]]:
    ref, mine = _Net(), _Net()
    ref_ddp, ddp = DDP(ref), DDP(mine)
    register(ddp, "onebit", plan=_plan(n), log_every=0)
    out = []
    for step in range(3):
        toks = [sorted(set(_tokens(mode, step, r))) for r in range(n)]
        union = len(set().union(*toks))
        chosen = gather_own(n, max(len(t) for t in toks), union)
        want = _step(ref, ref_ddp, _tokens(mode, step, rank), rank)
        got = _step(mine, ddp, _tokens(mode, step, rank), rank)
        close = torch.allclose(want, got, rtol=1e-6, atol=1e-7)
        same = torch.equal(want, got) and torch.equal(want.signbit(), got.signbit())
        every = [torch.empty_like(got) for _ in range(n)]
        dist.all_gather(every, got)
        alike = all(torch.equal(e.view(torch.int32), got.view(torch.int32)) for e in every)
        signed = bool(want.signbit().any()) if n == 2 and mode == "own" else True
        out.append((chosen, close, same or n > 2, alike and signed))
    return out


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("mode", ["own", "union"])
def test_exact_rows_either_way_equal_ddp(n: int, mode: str) -> None:
    for results in run_workers(_run, n, mode):
        for chosen, close, same, alike in results:
            assert chosen == (mode == "own")  # the tokens reach the path they are meant for
            assert close and same and alike


def test_gather_own_sends_fewer_bytes() -> None:
    # (N - 1) * most rows all-gathered against 2 (N - 1) / N * union allreduced
    assert gather_own(2, 110, 200) and not gather_own(2, 110, 110)
    assert gather_own(4, 110, 333) and not gather_own(4, 110, 200)
    assert not gather_own(4, 0, 0)
