"""Training with CaSync: a small model trained 200 steps with TernGrad under the PS strategy
ends within 5% of uncompressed DDP's loss."""

from __future__ import annotations

import dataclasses

import torch
from dist_utils import run_workers
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from hipress.casync import DefaultRule, register
from hipress.core.plan import Plan, Strategy

STEPS, BATCH = 200, 64


def _data(seed: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A noisy two-layer teacher: y = tanh(x W1) W2 + noise."""
    teacher = torch.Generator().manual_seed(1234)
    w1 = torch.randn(32, 64, generator=teacher) / 32**0.5
    w2 = torch.randn(64, 4, generator=teacher) / 8
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 32, generator=gen)
    return x, torch.tanh(x @ w1) @ w2 + 0.05 * torch.randn(n, 4, generator=gen)


def _train(rank: int, compress: bool) -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 4)
    )
    ddp = DDP(model)
    state = None
    if compress:
        # weights (>= 512 elements) compressed with the PS strategy (the default rule's choice
        # from three workers on), biases batched uncompressed
        rule = DefaultRule(min_compress_numel=512)
        entries = tuple(
            dataclasses.replace(e, strategy=Strategy.PS) if e.compress else e
            for e in (rule.entry(n, p.numel(), 3) for n, p in model.named_parameters())
        )
        plan = Plan("terngrad", {"bitwidth": 2}, 2, entries)
        state = register(ddp, "terngrad", params={"bitwidth": 2}, plan=plan)
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    xs, ys = _data(100 + rank, BATCH * STEPS)
    x_eval, y_eval = _data(999, 4096)

    def eval_loss() -> float:
        with torch.no_grad():
            return nn.functional.mse_loss(model(x_eval), y_eval).item()

    first = eval_loss()
    for s in range(STEPS):
        opt.zero_grad()
        batch = slice(BATCH * s, BATCH * (s + 1))
        nn.functional.mse_loss(ddp(xs[batch]), ys[batch]).backward()
        opt.step()
    out = {"first": first, "last": eval_loss()}
    if state is not None:
        out["strategies"] = {e.name: e.strategy for e in state.plan.entries}
        out["ratio"] = state.stats.last.ratio
    return out


def _both(rank: int, world_size: int) -> tuple[dict, dict]:
    return _train(rank, False), _train(rank, True)


def test_terngrad_ps_trains_like_ddp() -> None:
    plain, compressed = run_workers(_both, 2, timeout=300)[0]
    assert compressed["strategies"]["2.weight"] is Strategy.PS
    assert compressed["strategies"]["2.bias"] is Strategy.ALLREDUCE
    assert compressed["ratio"] < 0.25  # it really sent compressed gradients
    assert plain["last"] < 0.5 * plain["first"]  # and the task really trains
    assert abs(compressed["last"] - plain["last"]) <= 0.05 * plain["last"], (plain, compressed)
