"""PowerSGD in training over real gloo process groups (2 and 4 processes): the rounds hook
(hipress.casync.rounds_hook) trains a small model to within 10% of uncompressed DDP's loss,
every rank ends with the same parameters bit for bit, and it sends a fraction of DDP's bytes."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from dist_utils import run_workers
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from hipress.casync.rounds_hook import register_rounds

STEPS, BATCH = 40, 32


def _data(seed: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    teacher = torch.Generator().manual_seed(1234)
    w1 = torch.randn(32, 64, generator=teacher) / 32**0.5
    w2 = torch.randn(64, 4, generator=teacher) / 8
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 32, generator=gen)
    return x, torch.tanh(x @ w1) @ w2 + 0.05 * torch.randn(n, 4, generator=gen)


def _train(rank: int, world: int, compress: bool) -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 96), nn.ReLU(), nn.Linear(96, 96), nn.ReLU(),
                          nn.Linear(96, 4))  # fmt: skip
    # small buckets: several in flight at once, each bucket's rounds pipelined with the next
    ddp = DDP(model, bucket_cap_mb=0.02)
    state = register_rounds(ddp, "powersgd", params={"rank": 2}, start_iter=3) if compress else None
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    xs, ys = _data(100 + rank, BATCH * STEPS)
    x_eval, y_eval = _data(999, 2048)
    for s in range(STEPS):
        opt.zero_grad()
        batch = slice(BATCH * s, BATCH * (s + 1))
        nn.functional.mse_loss(ddp(xs[batch]), ys[batch]).backward()
        opt.step()
    with torch.no_grad():
        loss = nn.functional.mse_loss(model(x_eval), y_eval).item()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(every, flat)
    same = all(torch.equal(e, every[0]) for e in every)
    out = {"loss": loss, "same": same}
    if state is not None:
        out["sent"] = state.sent_bytes
        out["steps"] = state.iterations
    return out


def _both(rank: int, world_size: int) -> tuple[dict, dict]:
    return _train(rank, world_size, False), _train(rank, world_size, True)


@pytest.mark.parametrize("world", [2, 4])
def test_powersgd_trains_like_ddp_and_ranks_agree(world: int) -> None:
    plain, ps = run_workers(_both, world, timeout=300)[0]
    assert ps["same"] and plain["same"]
    assert ps["steps"] == STEPS
    full = sum(p.numel() for p in nn.Sequential(nn.Linear(32, 96), nn.Linear(96, 96),
                                                nn.Linear(96, 4)).parameters()) * 4  # fmt: skip
    assert ps["sent"] < 0.2 * full, ps  # P and Q, not the gradients
    assert ps["loss"] <= 1.1 * plain["loss"], (plain, ps)


def _nonfinite(rank: int, world: int) -> list[list[torch.Tensor]]:
    """Three steps of powersgd (rank 2) on one 6 x 10 gradient, the rounds summed by gloo: rank
    0 holds a NaN at step 0 and rank 1 an Inf at step 1; every rank's outputs."""
    from hipress.compll.rounds import load_rounds

    def allreduce(x: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(x)
        return x

    alg = load_rounds("powersgd", backend="cpu", rank=2)
    st = alg.init_state((6, 10))
    outs = []
    for s in range(3):
        g = torch.randn(6, 10, generator=torch.Generator().manual_seed(10 * s + rank))
        if s == 0 and rank == 0:
            g[2, 3] = float("nan")
        if s == 1 and rank == 1:
            g[4, 7] = float("inf")
        outs.append(alg.step(g, st, allreduce, world).view(6, 10).clone())
    return outs


def test_a_nan_or_inf_stays_non_finite_on_every_rank_and_the_state_is_dropped() -> None:
    ranks = run_workers(_nonfinite, 2, timeout=120)
    for outs in ranks:  # every rank applies the same
        assert all(
            torch.equal(a.view(torch.int32), b.view(torch.int32))
            for a, b in zip(outs, ranks[0], strict=True)
        )
    nan_step, inf_step, after = ranks[0]
    assert not torch.isfinite(nan_step[2, 3]) and not torch.isfinite(inf_step[4, 7])
    # the next step starts afresh: no NaN carried in the residual or in Q
    assert torch.isfinite(after).all()
