"""The default outer optimizer of hipress.diloco: DiLoCo's Nesterov step uncompressed, and
Nesterov SGD at lr 1.0 with momentum 0.5 where any tensor's codec keeps error feedback."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hipress.diloco.config import OUTER_FEEDBACK, OUTER_PLAIN, outer_defaults
from hipress.diloco.setup import default_outer


def _settings(opt: torch.optim.Optimizer) -> tuple[float, float, bool]:
    (group,) = opt.param_groups
    return group["lr"], group["momentum"], group["nesterov"]


@pytest.mark.parametrize(
    ("feedback", "want"),
    [
        (["none", "none"], (0.7, 0.9, True)),  # uncompressed: DiLoCo's
        (["own", "own"], (1.0, 0.5, True)),  # onebit, topk: their own feedback
        (["fp32", "none"], (1.0, 0.5, True)),  # one tensor with an external residual is enough
    ],
)
def test_default_outer_optimizer(feedback: list[str], want: tuple[float, float, bool]) -> None:
    model = nn.Linear(3, 2)
    named = list(model.named_parameters())
    opt = default_outer(named, feedback)
    assert isinstance(opt, torch.optim.SGD)
    assert _settings(opt) == want
    assert [id(p) for p in opt.param_groups[0]["params"]] == [id(p) for _, p in named]
    assert opt.param_groups[0]["foreach"] is True  # no temporary the size of the parameters


@pytest.mark.parametrize("feedback", [["none"], ["own"]])
def test_the_default_outer_step_equals_the_per_tensor_loop(feedback: list[str]) -> None:
    """foreach=True runs the same operations in the same order: the same bits, step by step."""
    torch.manual_seed(0)
    ours, theirs = nn.Linear(300, 70), nn.Linear(300, 70)
    theirs.load_state_dict(ours.state_dict())
    a = default_outer(list(ours.named_parameters()), feedback)
    b = torch.optim.SGD(theirs.parameters(), **outer_defaults(feedback), foreach=False)
    for _ in range(4):
        grads = [torch.randn_like(p) for p in ours.parameters()]
        for p, q, g in zip(ours.parameters(), theirs.parameters(), grads, strict=True):
            p.grad, q.grad = g.clone(), g.clone()
        a.step()
        b.step()
        for p, q in zip(ours.parameters(), theirs.parameters(), strict=True):
            assert torch.equal(p, q)


def test_outer_defaults_are_copies() -> None:
    got = outer_defaults(["own"])
    got["lr"] = 5.0
    assert OUTER_FEEDBACK["lr"] == 1.0 and outer_defaults(["none"]) == OUTER_PLAIN
