"""``register(ddp, "powersgd", plan="auto")`` over a real 2-process gloo group on a shaped
200 Mbit/s network: SeCoPa's plan (measured) runs the rounds on the large weight and keeps the
biases plain, and training with it is bit for bit the training with the same plan given
explicitly (as a saved file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import hipress.casync
from hipress.bench.netsim import ShapedNetwork, run_in_network, shaping_unavailable_reason
from hipress.core.plan import Plan, Strategy

PARAMS = {"rank": 2}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 4))


def _train(plan: Any, rank: int) -> tuple[nn.Module, Any]:
    ddp = DDP(_model())
    state = hipress.casync.register(ddp, "powersgd", params=PARAMS, plan=plan)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for s in range(3):
        gen = torch.Generator().manual_seed(100 * rank + s)
        x, y = torch.randn(8, 512, generator=gen), torch.randn(8, 4, generator=gen)
        opt.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    return ddp.module, state


def _case(rank: int, world: int, tmp: str) -> dict[str, Any]:
    auto, state = _train("auto", rank)
    plan = state.plan
    path = Path(tmp) / "plan.json"
    if rank == 0:
        plan.save(path)
    torch.distributed.barrier()
    given, again = _train(str(path), rank)
    same = all(torch.equal(a, b) for a, b in zip(auto.parameters(), given.parameters(),
                                                    strict=True))  # fmt: skip
    return {"plan": plan.to_dict(), "same": same, "digests": (plan.digest(), again.plan.digest())}


_REASON = shaping_unavailable_reason()


@pytest.mark.skipif(_REASON is not None, reason=f"shaped network: {_REASON}")
def test_auto_plan_runs_rounds_and_plain_and_matches_the_plan_given(tmp_path: Path) -> None:
    with ShapedNetwork(2, rate_mbit=200.0) as net:
        out = run_in_network(net, _case, str(tmp_path), timeout=240)
    plans = [Plan.from_dict(o["plan"]) for o in out]
    assert plans[0].digest() == plans[1].digest()  # one plan on every rank
    kinds = {e.name: e.strategy for e in plans[0].entries}
    assert kinds["0.weight"] is Strategy.ROUNDS, plans[0].meta["rounds_prices"]
    assert kinds["0.bias"] is Strategy.ALLREDUCE and kinds["2.bias"] is Strategy.ALLREDUCE
    prices = plans[0].meta["rounds_prices"]["0.weight"]
    assert prices["chosen"] == "rounds" and prices["total_ms"] < prices["plain_ms"]
    assert plans[0].meta["planner"] == "rounds-auto"
    for o in out:
        assert o["same"], "plan='auto' trains differently from the same plan given as a file"
        assert o["digests"][0] == o["digests"][1]
