"""The gradients' ready times: measured in backward (one process), held by a profile."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hipress.core.plan import PlanError
from hipress.secopa.measure.readiness import ReadyClock, measure_readiness
from hipress.secopa.model.profile import ProfileError, Readiness


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(50, 16), nn.Flatten(), nn.Linear(64, 256), nn.ReLU(),
                         nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 3))  # fmt: skip


def test_measure_readiness_orders_backward_and_leaves_no_hooks() -> None:
    model = _net()
    x = torch.randint(0, 50, (32, 4))
    calls = []

    def step() -> None:
        calls.append(1)
        model.zero_grad()
        model(x).sum().backward()

    ready = measure_readiness(model, step, steps=3, warmup=1)
    assert len(calls) == 4 and ready.steps == 3
    assert set(ready.leads_ms) == {n for n, _ in model.named_parameters()}
    # backward runs from the output: the last layer's gradient first, the embedding's last
    assert ready.lead("6.weight") > ready.lead("2.weight") > ready.lead("0.weight") >= 0
    assert ready.backward_ms == max(ready.leads_ms.values())
    assert ready.meta["step_ms"] > 0
    # its hooks are gone from the parameters once it returns
    assert all(not p._post_accumulate_grad_hooks for p in model.parameters())
    clock = ReadyClock(model)
    assert all(len(p._post_accumulate_grad_hooks) == 1 for p in model.parameters())
    step()
    clock.step_done()
    assert clock.leads() == {}  # not on: nothing recorded
    clock.remove()
    assert all(not p._post_accumulate_grad_hooks for p in model.parameters())


def test_measure_readiness_needs_a_backward() -> None:
    with pytest.raises(PlanError, match="no gradient became ready"):
        measure_readiness(_net(), lambda: None, steps=2)
    with pytest.raises(PlanError, match="steps >= 1"):
        measure_readiness(_net(), lambda: None, steps=0)


def test_readiness_validates_and_round_trips() -> None:
    r = Readiness({"a": 1.5, "b": 0.0}, backward_ms=2.0, steps=3, meta={"step_ms": 5.0})
    assert Readiness.from_dict(r.to_dict()) == r
    with pytest.raises(ProfileError, match="finite and >= 0"):
        Readiness({"a": float("nan")})
    with pytest.raises(ProfileError, match="backward_ms"):
        Readiness({}, backward_ms=-1.0)
    with pytest.raises(ProfileError, match="malformed readiness"):
        Readiness.from_dict({"leads_ms": ["a"]})
