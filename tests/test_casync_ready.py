"""CaSync's plan="auto" with measured ready times (hipress.casync.ready)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from hipress.casync.ready import ReadyProbe
from hipress.codec.errors import CaSyncError
from hipress.core.plan import PlanError
from hipress.secopa.measure.readiness import ReadyClock, agree_readiness, quantise


def test_quantise_rounds_to_the_grid_so_noise_below_it_moves_nothing() -> None:
    a = quantise({"w": 10.2, "b": 0.24, "e": 0.26}, 0.5)
    b = quantise({"w": 9.8, "b": 0.01, "e": 0.49}, 0.5)
    assert a == b == {"w": 10.0, "b": 0.0, "e": 0.5}
    with pytest.raises(PlanError, match="quantum must be > 0"):
        quantise({"w": 1.0}, 0.0)


def test_agree_without_a_group_is_this_ranks_times_rounded() -> None:
    ready = agree_readiness({"a": 3.3, "b": 0.1}, ["a", "b", "c"], steps=3)
    assert dict(ready.leads_ms) == {"a": 3.5, "b": 0.0, "c": 0.0}
    assert ready.backward_ms == 3.5 and ready.steps == 3 and ready.meta["quantum_ms"] == 0.5


def test_the_clock_on_named_parameters_stamps_backward_in_reverse_layer_order() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(4)])
    clock = ReadyClock(list(model.named_parameters()))
    clock.on = True
    for _ in range(2):
        model(torch.randn(512, 256)).sum().backward()
        clock.step_done(at_last=True)
    clock.remove()
    leads = clock.leads()
    assert clock.steps == 2 and leads["0.weight"] == 0.0  # the first layer is ready last
    order = [leads[f"{i}.weight"] for i in range(4)]
    assert order == sorted(order) and order[-1] > 0, leads


@pytest.mark.parametrize("bad", [-1, 1.5, "3", True])
def test_ready_steps_must_be_a_whole_number(bad: Any) -> None:
    with pytest.raises(CaSyncError, match="ready_steps must be a whole number >= 0"):
        ReadyProbe.of("auto", False, [("w", torch.zeros(2, requires_grad=True))], bad)


def test_only_auto_over_real_parameters_measures() -> None:
    w = torch.zeros(2, requires_grad=True)
    assert ReadyProbe.of("auto", False, [("w", w)], 3).steps == 3
    assert ReadyProbe.of(None, False, [("w", w)], 3).steps == 0  # the default rule
    assert ReadyProbe.of("auto", True, [("w", w)], 3).steps == 0  # multi-round
    assert ReadyProbe.of("auto", False, [("w", 2)], 3).steps == 0  # (name, numel) pairs
    assert ReadyProbe.of("auto", False, [("w", w)], 0).steps == 0  # the default: off


@pytest.fixture(scope="module")
def launches() -> list[list[dict[str, Any]]]:
    from casync_ready_launch import launch

    return [launch(), launch()]


def test_auto_records_ready_times_agreed_over_ranks_in_reverse_layer_order(
    launches: list[list[dict[str, Any]]],
) -> None:
    ranks = launches[0]
    assert ranks[0]["readiness"] == ranks[1]["readiness"]
    leads = ranks[0]["readiness"]["leads_ms"]
    assert set(leads) == set(ranks[0]["names"])
    order = [leads[f"{i}.weight"] for i in (0, 2, 3, 4, 5)]  # embedding, then the linears
    assert order == sorted(order) and order[0] == 0.0 and order[-1] > 0, leads
    assert ranks[0]["readiness"]["meta"]["agreed"] == "median over ranks"


def test_auto_plans_rows_by_the_exposed_step_and_advises_a_cap(
    launches: list[list[dict[str, Any]]],
) -> None:
    for r in (ranks[0] for ranks in launches):
        price = r["row_prices"]["0.weight"]  # the embedding, ready last: it hides nothing
        assert price["objective"] == "exposed step" and "breakeven_alone" in price, price
        assert price["touched"] == 64  # the most rows one rank touched in the counted step
        rows = price["touched"] <= price["breakeven"]  # (rows pay: the step exposes less)
        assert price["chosen"] == ("rows" if rows else "dense"), price
        assert (r["rows"].get("0.weight", 0) == 129) == rows, (r["rows"], price)
        cap = r["bucket_cap"]
        assert "bucket_cap_mb" in cap and cap["reason"] and cap["exposed_ms"], cap
        assert any("pass DistributedDataParallel(model" in line for line in r["log"]), r["log"]


def test_two_fresh_launches_plan_alike_on_every_rank(
    launches: list[list[dict[str, Any]]],
) -> None:
    for ranks in launches:  # one plan per launch, on every rank, from the same ready times
        assert len({r["digest"] for r in ranks}) == 1
        assert ranks[0]["readiness"] == ranks[1]["readiness"]
    # (the same plan across launches is counted by `python tests/casync_ready_launch.py`:
    # the measured costs, not only the ready times, vary from launch to launch)
    order = [sorted(r[0]["readiness"]["leads_ms"], key=r[0]["readiness"]["leads_ms"].get)
             for r in launches]  # fmt: skip
    assert [o[0] for o in order] == ["0.weight", "0.weight"], order
