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


def test_outer_defaults_are_copies() -> None:
    got = outer_defaults(["own"])
    got["lr"] = 5.0
    assert OUTER_FEEDBACK["lr"] == 1.0 and outer_defaults(["none"]) == OUTER_PLAIN
