"""Worker functions for tests/test_diloco*.py: each runs on every rank of a real gloo group
(:func:`dist_utils.run_workers`) and returns plain tensors and numbers for the test to check."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hipress.diloco import DiLoCo

# ---------------------------------------------------------------- models and data


def small_model(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def batch(rank: int, step: int, n: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """A regression batch of a fixed random linear map plus noise, different per rank and step."""
    w = torch.randn(8, 4, generator=torch.Generator().manual_seed(7))
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(n, 8, generator=g)
    return x, torch.tanh(x @ w) + 0.05 * torch.randn(n, 4, generator=g)


def inner_step(model: nn.Module, opt: torch.optim.Optimizer, rank: int, step: int) -> float:
    x, y = batch(rank, step)
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return float(loss.detach())


def outer_gradients(d: DiLoCo) -> list[torch.Tensor]:
    """Each parameter's outer gradient now (anchor - local, float32), as DiLoCo computes it."""
    return [torch.sub(a.float(), p.detach().float()).reshape(-1)
            for a, (_, p) in zip(d.anchors, d.named, strict=True)]  # fmt: skip


def record_means(d: DiLoCo) -> list[list[torch.Tensor]]:
    """Instrument ``d`` so every outer step's mean outer gradients are kept (the list returned)."""
    seen: list[list[torch.Tensor]] = []
    real = d.outer_step

    def outer_step(k: int, means: list[torch.Tensor]) -> None:
        seen.append([m.clone() for m in means])
        real(k, means)

    d.outer_step = outer_step  # type: ignore[method-assign]
    return seen


# ---------------------------------------------------------------- exactness


def dyadic_rounds(rank: int, world: int, algorithm: Any, rounds: int, lr: float = 0.7,
                  momentum: float = 0.9) -> dict[str, Any]:  # fmt: skip
    """Outer syncs of hand-set local weights: weights start on a 1/64 grid and each round rank
    r's weights are the anchor minus a delta on that grid. With ``lr`` and ``momentum`` powers
    of two the anchors stay on a grid and any summation order is exact. Returns the start, the
    outer gradients of every round (as DiLoCo computes them) and the weights after each round."""
    model = small_model()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_((p * 64).round() / 64)
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    outer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, nesterov=True)
    d = DiLoCo(model, inner, sync_every=2, algorithm=algorithm, outer_optimizer=outer)
    params = [p for p in model.parameters()]
    out: dict[str, Any] = {"start": [p.detach().clone() for p in params], "deltas": [],
                           "after": []}  # fmt: skip
    for t in range(rounds):
        g = torch.Generator().manual_seed(100 * t + rank)
        deltas = [torch.randint(-64, 65, p.shape, generator=g).float() / 64 for p in params]
        d.step()
        with torch.no_grad():
            for p, a, dl in zip(params, d.anchors, deltas, strict=True):
                p.copy_(a - dl)
        out["deltas"].append([g.view(p.shape) for g, p in zip(outer_gradients(d), params,
                                                               strict=True)])  # fmt: skip
        d.step()
        out["after"].append([p.detach().clone() for p in params])
    return out


def trained_rounds(rank: int, world: int, algorithm: Any, rounds: int, h: int = 3,
                   **kw: Any) -> dict[str, Any]:  # fmt: skip
    """Real inner SGD steps; returns each sync's outer gradients (this rank's, as sent) and the
    means applied, with the parameter names."""
    model = small_model()
    inner = torch.optim.SGD(model.parameters(), lr=0.05)
    d = DiLoCo(model, inner, sync_every=h, algorithm=algorithm, **kw)
    seen = record_means(d)
    sent = []
    for step in range(1, rounds * h + 1):
        inner_step(model, inner, rank, step)
        if step % h == 0:
            sent.append(outer_gradients(d))
        d.step()
    return {"names": [n for n, _ in d.named], "sent": sent, "means": seen,
            "params": [p.detach().clone() for p in model.parameters()]}  # fmt: skip


def mass(rank: int, world: int, algorithm: str, rounds: int) -> dict[str, Any]:
    """Outer SGD with lr 1 and no momentum, so the anchor moves by exactly the applied means:
    returns the anchor's total move, this rank's sum of sent outer gradients and what its
    error feedback still owes."""
    model = small_model()
    inner = torch.optim.SGD(model.parameters(), lr=0.05)
    outer = torch.optim.SGD(model.parameters(), lr=1.0)
    d = DiLoCo(model, inner, sync_every=2, algorithm=algorithm, outer_optimizer=outer)
    start = [a.clone() for a in d.anchors]
    total = [torch.zeros(a.numel()) for a in d.anchors]
    for step in range(1, 2 * rounds + 1):
        inner_step(model, inner, rank, step)
        if step % 2 == 0:
            for tot, g in zip(total, outer_gradients(d), strict=True):
                tot.add_(g)
        d.step()
    moved = [(s - a).reshape(-1) for s, a in zip(start, d.anchors, strict=True)]
    return {"moved": moved, "sent": total, "owed": list(d.owed().values())}
