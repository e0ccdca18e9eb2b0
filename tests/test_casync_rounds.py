"""Multi-round algorithms through the normal CaSync API (``register(ddp, "powersgd")``), over
real gloo process groups (2 and 4 processes): the same parameters bit for bit as
``rounds_hook.register_rounds``; an embedding as exact rows while PowerSGD runs on the rest;
checkpoints that resume bit-exactly; the plan's entries; trace spans; typed refusals."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.distributed as dist
from dist_utils import run_workers
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import hipress.casync
from hipress.casync.rounds_hook import register_rounds
from hipress.codec.errors import CaSyncError
from hipress.core.plan import Plan, PlanError, Strategy

PARAMS = {"rank": 2}


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 48), nn.ReLU(), nn.Linear(48, 48), nn.ReLU(),
                         nn.Linear(48, 4))  # fmt: skip


def _steps(ddp: nn.Module, rank: int, steps: range) -> None:
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for s in steps:
        gen = torch.Generator().manual_seed(100 * rank + s)
        x, y = torch.randn(16, 32, generator=gen), torch.randn(16, 4, generator=gen)
        opt.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _same_as_rounds_hook(rank: int) -> dict[str, Any]:
    """Six steps (two warm-up) through register and through register_rounds, small buckets."""
    hook = DDP(_mlp(), bucket_cap_mb=0.004)
    register_rounds(hook, "powersgd", params=PARAMS, start_iter=2)
    _steps(hook, rank, range(3))
    _steps(hook, rank, range(3, 6))
    ours = DDP(_mlp(), bucket_cap_mb=0.004)
    state = hipress.casync.register(ours, "powersgd", params=PARAMS, warmup_steps=2)
    _steps(ours, rank, range(3))
    state.trace(None, steps=1)
    _steps(ours, rank, range(3, 6))
    kinds = {e.strategy for e in state.plan.entries}
    whats = {e.get("args", {}).get("what") for e in state.tracer.events()}
    return {"equal": torch.equal(_flat(hook.module), _flat(ours.module)), "kinds": kinds,
            "whats": whats, "sent": state.stats.last.bytes_sent if state.stats.last else 0}  # fmt: skip


def _resume(rank: int) -> bool:
    """3 steps, a checkpoint, 3 more; against a fresh state loading it and running the 3."""
    ddp = DDP(_mlp(), bucket_cap_mb=0.004)
    state = hipress.casync.register(ddp, "powersgd", params=PARAMS, warmup_steps=1)
    _steps(ddp, rank, range(3))
    sd, weights = state.state_dict(), copy.deepcopy(ddp.module.state_dict())
    _steps(ddp, rank, range(3, 6))
    model = _mlp()
    model.load_state_dict(weights)
    again = DDP(model, bucket_cap_mb=0.004)
    hipress.casync.register(again, "powersgd", params=PARAMS, warmup_steps=1).load_state_dict(sd)
    _steps(again, rank, range(3, 6))
    return torch.equal(_flat(ddp.module), _flat(again.module))


class _LM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(1000, 16)
        self.out = nn.Linear(16, 32)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(self.emb(tokens).mean(1))


def _rows(rank: int, world: int) -> dict[str, Any]:
    """The embedding goes plain in step 0 (its rows counted), exact rows from step 1; the
    linear layer's weight runs the rounds."""
    model = _LM()
    ddp = DDP(model)
    state = hipress.casync.register(ddp, "powersgd", params=PARAMS)
    err = 0.0
    for s in range(3):
        gen = torch.Generator().manual_seed(10 * rank + s)
        tokens = torch.randint(0, 1000, (4, 3), generator=gen)
        local = copy.deepcopy(model)
        local.emb.weight.grad = None
        local(tokens).square().mean().backward()
        mine = local.emb.weight.grad.clone()
        every = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(every, mine)
        model.zero_grad()
        ddp(tokens).square().mean().backward()
        err = max(err, float((model.emb.weight.grad - sum(every) / world).abs().max()))
    entries = {e.name: (e.strategy, e.row_bound) for e in state.plan.entries}
    return {"err": err, "entries": entries, "sent": state.stats.last.bytes_sent}


def _misuse(rank: int) -> list[str]:
    """Typed refusals naming the option or the tensor."""
    msgs = []
    try:
        hipress.casync.register(DDP(_mlp()), "powersgd", params=PARAMS,
                                params_schedule=[(0, {"rank": 2})])  # fmt: skip
    except CaSyncError as exc:
        msgs.append(str(exc))
    plan = hipress.casync.register(DDP(_mlp()), "powersgd", params=PARAMS).plan.to_dict()
    plan["entries"][0].update(strategy="ps", partitions=2)
    try:
        hipress.casync.register(DDP(_mlp()), "powersgd", params=PARAMS, plan=Plan.from_dict(plan))
    except PlanError as exc:
        msgs.append(str(exc))
    return msgs


def _case(rank: int, world: int) -> dict[str, Any]:
    out = {"hook": _same_as_rounds_hook(rank), "rows": _rows(rank, world)}
    if world == 2:
        out["resume"] = _resume(rank)
        out["misuse"] = _misuse(rank)
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_register_powersgd_matches_rounds_hook_rows_checkpoints_and_refusals(world: int) -> None:
    out = run_workers(_case, world, timeout=300)
    for o in out:
        assert o["hook"]["equal"], "register(ddp, 'powersgd') differs from register_rounds"
        assert o["hook"]["kinds"] == {Strategy.ROUNDS, Strategy.ALLREDUCE}
        assert {"rounds: p allreduce", "rounds: q allreduce"} <= o["hook"]["whats"], o["hook"]
        rows = o["rows"]
        assert rows["entries"]["emb.weight"][1] > 0, rows  # exact rows
        assert rows["entries"]["out.weight"] == (Strategy.ROUNDS, 0)
        assert rows["entries"]["out.bias"] == (Strategy.ALLREDUCE, 0)
        assert rows["err"] < 1e-6, rows  # the embedding's gradient is the exact mean
        assert rows["sent"] < 1000 * 16 * 4 / 4  # rows, P and Q: not the dense embedding
    if world == 2:
        assert all(o["resume"] for o in out)
        msgs = out[0]["misuse"]
        assert len(msgs) == 2, msgs
        assert "params_schedule" in msgs[0]
        assert "0.weight" in msgs[1] and "strategy ps" in msgs[1], msgs[1]
