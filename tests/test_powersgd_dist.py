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
