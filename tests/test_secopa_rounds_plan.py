"""SeCoPa's plan for a multi-round algorithm (:func:`plan_rounds`) from given costs: which
tensors run PowerSGD's rounds, stay plain or are priced as exact rows; ties; stability."""

from __future__ import annotations

import logging

import pytest

from hipress.casync.rounds_plan import resolve
from hipress.core.plan import PlanError, Strategy
from hipress.core.rule import Selection
from hipress.secopa.model.costfn import AffineFloor
from hipress.secopa.model.network import link_network
from hipress.secopa.model.rounds import price_rounds
from hipress.secopa.model.rounds_planner import RoundsProfile, plan_rounds

ALG = resolve("powersgd", {"rank": 2}, "auto")
NAMED = [("emb.weight", (30000, 64)), ("fc.weight", (1024, 512)), ("fc.bias", (1024,)),
         ("head.weight", (8, 8)), ("conv.weight", (64, 32, 3, 3))]  # fmt: skip
COMPUTE = {(30000, 64): 2.0, (1024, 512): 1.0, (8, 8): 0.05, (64, 32, 3, 3): 0.3}


def _profile(gbit: float = 1.0) -> RoundsProfile:
    net = link_network(gbit * 1.25e8, 25e-6)
    return RoundsProfile(net, COMPUTE, AffineFloor(1e-6, 0.0), call_ms=0.1)


def test_large_weights_run_the_rounds_small_and_1d_stay_plain_embeddings_get_rows() -> None:
    plan = plan_rounds(ALG, NAMED, 4, _profile())
    kinds = {e.name: e.strategy for e in plan.entries}
    assert kinds == {"emb.weight": Strategy.ALLREDUCE, "fc.weight": Strategy.ROUNDS,
                     "fc.bias": Strategy.ALLREDUCE, "head.weight": Strategy.ALLREDUCE,
                     "conv.weight": Strategy.ROUNDS}  # fmt: skip
    kept = plan.meta["kept_plain"]
    assert kept["fc.bias"] == "1-D" and kept["head.weight"] == "plain is faster"
    fc = plan.meta["rounds_prices"]["fc.weight"]
    want = price_rounds(ALG, (1024, 512), 4, _profile().network, 1.0)
    assert fc["rounds_ms"] == [round(r + 0.1, 6) for r in want.rounds_ms]  # each call costs 0.1
    assert fc["speedup"] > 1 and fc["total_ms"] == plan.lookup("fc.weight").predicted_ms
    # the embedding: plain in the first step, then rows up to the break-even, else its rounds
    assert plan.meta["embeddings"] == ["emb.weight"]
    assert plan.meta["embedding_dense"] == {"emb.weight": "rounds"}
    assert 0 < plan.meta["row_prices"]["emb.weight"]["breakeven"] < 30000
    assert plan.to_dict() == plan_rounds(ALG, NAMED, 4, _profile()).to_dict()  # deterministic


def test_a_faster_network_or_a_slower_codec_keeps_tensors_plain() -> None:
    costly = _profile()
    costly = RoundsProfile(costly.network, {**COMPUTE, (1024, 512): 500.0}, costly.merge, 0.1)
    assert plan_rounds(ALG, NAMED, 4, costly).lookup("fc.weight").strategy is Strategy.ALLREDUCE
    fast = plan_rounds(ALG, NAMED, 4, _profile(gbit=1000.0))
    assert fast.lookup("fc.weight").strategy is Strategy.ALLREDUCE
    assert fast.meta["embedding_dense"].get("emb.weight", "plain") == "plain"
    # one worker: nothing to send, everything plain
    assert not any(e.compress for e in plan_rounds(ALG, NAMED, 1, _profile()).entries)


def test_close_calls_stay_plain_and_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    prof = _profile()
    base = price_rounds(ALG, (1024, 512), 4, prof.network, 0.0)
    plain = base.plain_ms + 0.1
    rounds_only = sum(base.rounds_ms) + 0.2
    margin = 0.03 * plain
    for gap, want in ((margin * 0.5, Strategy.ALLREDUCE), (-margin * 0.5, Strategy.ALLREDUCE),
                      (margin * 1.5, Strategy.ROUNDS)):  # fmt: skip
        compute = plain - rounds_only - gap  # rounds faster than plain by `gap`
        p = RoundsProfile(prof.network, {**COMPUTE, (1024, 512): compute}, prof.merge, 0.1)
        with caplog.at_level(logging.INFO, logger="hipress.secopa.model.rounds_planner"):
            plan = plan_rounds(ALG, NAMED, 4, p)
        assert plan.lookup("fc.weight").strategy is want, gap
        assert ("fc.weight" in plan.meta["close_calls"]) == (want is Strategy.ALLREDUCE)
    assert "a close call, kept plain" in caplog.text


def test_selection_and_bad_input() -> None:
    plan = plan_rounds(ALG, NAMED, 4, _profile(), Selection(exclude=("fc.*",)))
    assert plan.lookup("fc.weight").strategy is Strategy.ALLREDUCE
    assert "fc.weight" not in plan.meta["rounds_prices"]
    with pytest.raises(PlanError, match=r"no measured encode/decode cost for shape \[3, 3\]"):
        plan_rounds(ALG, [("w", (3, 3))], 2, _profile())
    with pytest.raises(PlanError, match="world_size"):
        plan_rounds(ALG, NAMED, 0, _profile())
    with pytest.raises(PlanError, match="lacks"):
        RoundsProfile({}, {})
