"""The DDP hook's ``plan=`` words on real gloo groups: ``"default"`` is the default rule, as
None is and as FSDP's ``plan="default"`` is."""

from __future__ import annotations

import torch
from dist_utils import run_workers
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from hipress.casync import register


def _train(plan: str | None) -> tuple[str, list[torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 300), nn.ReLU(), nn.Linear(300, 4))
    ddp = DDP(model)
    state = register(ddp, "onebit", plan=plan)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(torch.distributed.get_rank())
    for _ in range(3):
        opt.zero_grad()
        ddp(torch.randn(8, 256, generator=gen)).square().mean().backward()
        opt.step()
    return state.plan.digest(), [p.detach().clone() for p in model.parameters()]


def _both(rank: int, world_size: int) -> tuple[bool, bool, int]:
    word_digest, word_params = _train("default")
    none_digest, none_params = _train(None)
    same = all(torch.equal(a, b) for a, b in zip(word_params, none_params, strict=True))
    torch.manual_seed(0)
    state = register(DDP(nn.Sequential(nn.Linear(256, 300), nn.ReLU(), nn.Linear(300, 4))),
                     "onebit", plan="default")  # fmt: skip
    compressed = sum(e.compress for e in state.plan.entries)
    return word_digest == none_digest, same, compressed


def test_plan_default_is_the_default_rule_on_two_ranks() -> None:
    for same_plan, same_params, compressed in run_workers(_both, 2):
        assert same_plan and same_params
        assert compressed == 1  # the 76,800-element weight; the rest stay under the rule's size
