"""Error feedback under DDP's find_unused_parameters=True: a parameter no rank used in a step
keeps its states as they were (DDP discards what was synchronised for it), a parameter used on
some rank consumes them as usual, and checkpoints see the restored states."""

from __future__ import annotations

import pytest
import torch
from dist_utils import run_workers
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from hipress.casync import register
from hipress.core.plan import Plan, Strategy, TensorPlan


class TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.trunk = nn.Linear(16, 64)
        self.a = nn.Linear(64, 4)
        self.b = nn.Linear(64, 4)

    def forward(self, x: torch.Tensor, use_b: bool) -> torch.Tensor:
        h = torch.relu(self.trunk(x))
        return self.a(h) + self.b(h) if use_b else self.a(h)


def _states_of(state, prefix: str) -> dict[str, dict]:  # type: ignore[no-untyped-def]
    out = {}
    for part in ("worker", "server"):
        for k, s in state.state_dict()[part].items():
            if k.startswith(prefix):
                out[f"{part}:{k}"] = s
    return out


def _same(x: dict, y: dict) -> bool:
    return x.keys() == y.keys() and all(
        x[k]["step"] == y[k]["step"]
        and all(torch.equal(x[k]["tensors"][t], y[k]["tensors"][t]) for t in x[k]["tensors"])
        for k in x
    )


def _raw(state, prefix: str) -> dict[str, dict]:  # type: ignore[no-untyped-def]
    """Copies of the states, read without settling them (unlike state_dict)."""
    out = {}
    for part, states in (("worker", state.worker_states), ("server", state.server_states)):
        for k, s in states.items():
            if k.startswith(prefix):
                tensors = {t: v.clone() for t, v in s.tensors.items()}
                out[f"{part}:{k}"] = {"step": s.step, "tensors": tensors}
    return out


# b used by every rank, by none, by none, by rank 0 only, by none, by every rank
USES = [(True, True), (False, False), (False, False), (True, False), (False, False), (True, True)]


def _unused_everywhere(rank: int, world_size: int, alg: str, strategy: str, read: str) -> None:
    model = TwoHeads()
    ddp = DDP(model, find_unused_parameters=True, bucket_cap_mb=0.001)
    s = Strategy(strategy)
    plan = Plan(alg, {}, world_size, tuple(
        TensorPlan(n, p.numel(), True, s, 1) for n, p in model.named_parameters()))  # fmt: skip
    state = register(ddp, alg, plan=plan, log_every=0)
    seen: list[tuple[dict, dict]] = []  # (a, b) as each forward pass finds them
    ddp.register_forward_hook(lambda *_: seen.append((_raw(state, "a."), _raw(state, "b."))))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step, use in enumerate([*USES, (True, True)]):
        if read == "checkpoint":
            before_a, before_b = _states_of(state, "a."), _states_of(state, "b.")
        opt.zero_grad(set_to_none=True)
        gen = torch.Generator().manual_seed(100 * step + rank)
        ddp(torch.randn(8, 16, generator=gen), use[rank]).square().mean().backward()
        opt.step()
        assert (model.b.weight.grad is None) == (not any(use))
        if read == "checkpoint" and step < len(USES):
            after_a, after_b = _states_of(state, "a."), _states_of(state, "b.")
            assert not _same(before_a, after_a), step  # a is always used: its states move
            # b's states move where the result was applied, else stay as if never synchronised
            assert _same(before_b, after_b) == (not any(use)), (step, rank)
    if read == "forward":  # the next forward pass settles the step before it
        for step, use in enumerate(USES):
            (a0, b0), (a1, b1) = seen[step], seen[step + 1]
            assert not _same(a0, a1), step
            assert _same(b0, b1) == (not any(use)), (step, rank)


@pytest.mark.parametrize("read", ["forward", "checkpoint"])
@pytest.mark.parametrize("alg,strategy", [("topk", "allgather"), ("onebit", "ps"), ("dgc", "ring")])
def test_states_of_parameters_no_rank_used_are_kept(alg: str, strategy: str, read: str) -> None:
    run_workers(_unused_everywhere, 2, alg, strategy, read)
