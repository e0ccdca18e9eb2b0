"""Profiles: the alpha-beta network model at any world size, JSON round trips, errors."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hipress.secopa.model.costfn import AffineFloor, PiecewiseLinear
from hipress.secopa.model.planner import plan_named
from hipress.secopa.model.profile import (
    AlphaBeta,
    FittedComm,
    PayloadModel,
    Profile,
    ProfileError,
    Readiness,
    affine_profile,
    link_network,
)


def _profile() -> Profile:
    return affine_profile(
        "terngrad",
        encode=(2e-7, 0.01, 0.01),
        decode=(1e-7, 0.005, 0.005),
        merge=(5e-8, 0.002, 0.002),
        bytes_per_element=0.25,
        header=16,
        params={"bitwidth": 2},
    )


@pytest.mark.parametrize("n", [2, 3, 8, 64, 1024])
def test_ring_allreduce_is_the_textbook_formula(n: int) -> None:
    op = AlphaBeta(0.02, 1e-6, ("ring_allreduce",))
    b = 4e6
    assert float(op.time(b, n)) == pytest.approx(2 * (n - 1) * 0.02 + 2 * (n - 1) / n * b * 1e-6)


@pytest.mark.parametrize("n", [2, 5, 64, 1024])
def test_link_network_uses_the_cheapest_algorithm_of_each_collective(n: int) -> None:
    net = link_network(1.25e9, 25e-6)  # 10 Gbit/s
    alpha, beta = 0.025, 1e3 / 1.25e9
    lg = math.ceil(math.log2(n))
    small, big = 64.0, 1e9
    # small messages: recursive halving-doubling (log N steps); large: equal bandwidth terms
    assert float(net["allreduce"].time(small, n)) == pytest.approx(
        min(2 * (n - 1), 2 * lg) * alpha + 2 * (n - 1) / n * small * beta
    )
    assert float(net["all_gather"].time(big, n)) == pytest.approx(
        min(n - 1, lg) * alpha + (n - 1) * big * beta
    )
    assert float(net["all_to_all"].time(big, n)) == pytest.approx(
        (n - 1) * alpha + (n - 1) / n * big * beta
    )
    assert float(net["allreduce"].time(big, 1)) == 0.0  # one worker: nothing to send


def test_unknown_collective_algorithm_is_rejected() -> None:
    with pytest.raises(ProfileError, match="unknown collective algorithms"):
        AlphaBeta(0.01, 1e-6, ("butterfly",))


def test_payload_model_ratio() -> None:
    pm = PayloadModel(0.25, 16)
    assert pm.ratio(1 << 20) == pytest.approx((0.25 * 2**20 + 16) / 2**22)


def test_decode_acc_falls_back_to_decode_plus_merge() -> None:
    p = _profile()
    x = np.array([10.0, 1e6])
    np.testing.assert_allclose(
        p.compute_ms("decode_acc", x), p.compute_ms("decode", x) + p.compute_ms("merge", x)
    )
    assert float(p.compute_ms("encode", 0)) == 0.0


def test_averaging_costs_with_and_without_a_measured_decode_sum() -> None:
    p = _profile()
    x = np.array([10.0, 1e6])
    # no decode_sum2: each further payload is a decode_acc, the average one merge pass
    np.testing.assert_allclose(p.compute_ms("decode_more", x), p.compute_ms("decode_acc", x))
    np.testing.assert_allclose(p.compute_ms("average", x), p.compute_ms("merge", x))
    fused = dataclasses.replace(
        p, compute={**p.compute, "decode_sum2": AffineFloor(1e-6, 0.01, 0.02)}
    )
    more = fused.compute_ms("decode_sum2", x) - fused.compute_ms("decode", x)
    np.testing.assert_allclose(fused.compute_ms("decode_more", x), np.maximum(more, 0.0))
    assert np.all(fused.compute_ms("average", x) == 0.0)  # inside decode_sum2
    cheap = dataclasses.replace(p, compute={**p.compute, "decode_sum2": AffineFloor(0, 0, 0)})
    assert np.all(cheap.compute_ms("decode_more", x) == 0.0)  # never negative


@given(
    bw=st.floats(1e6, 1e12),
    lat=st.floats(0.0, 1e-3),
    ov=st.floats(0.0, 1.0),
)
def test_json_round_trip(bw: float, lat: float, ov: float) -> None:
    p = _profile().with_link(bw, lat, overlap=ov)
    q = Profile.from_json(p.to_json())
    assert q.to_dict() == p.to_dict()
    assert q.network["allreduce"] == p.network["allreduce"]


def test_calibration_round_trips_and_older_profiles_load_uncalibrated() -> None:
    p = replace(_profile(), compute_scale=1.7, call_ms=0.4)
    q = Profile.from_json(p.to_json())
    assert (q.compute_scale, q.call_ms) == (1.7, 0.4)
    d = json.loads(_profile().to_json())
    del d["compute_scale"], d["call_ms"], d["compute_scale_by_size"]  # before calibration
    old = Profile.from_dict(d)
    assert (old.compute_scale, old.call_ms, old.compute_scale_by_size) == (1.0, 0.0, ())


def test_ready_times_round_trip_and_older_profiles_load_without_them(tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    ready = Readiness({"w": 12.5, "b": 0.25}, backward_ms=13.0, steps=5, meta={"step_ms": 20.0})
    p = _profile().with_readiness(ready)
    p.save(tmp_path / "ready.json")
    q = Profile.load(tmp_path / "ready.json")
    assert q.readiness == ready and q.to_dict() == p.to_dict()
    assert q.readiness is not None and q.readiness.lead("w") == 12.5
    assert q.readiness.lead("never measured") == 0.0  # counts as ready at the end
    # a profile without ready times writes what older versions wrote: no key at all
    d = json.loads(_profile().to_json())
    assert "readiness" not in d and "readiness" in json.loads(p.to_json())
    old = Profile.from_dict(d)
    assert old.readiness is None and old.to_dict() == _profile().to_dict()
    # ... and plans as before, by the sum of costs, saying so
    named = [("w", 1 << 22), ("b", 1 << 10)]
    with caplog.at_level("INFO", logger="hipress.secopa.model.planner"):
        plan = plan_named(named, old, 4)
    assert "no gradient ready times" in caplog.text
    assert "exposure" not in plan.meta and "exposed" not in plan.totals
    assert plan.meta["planner"]["objective"] == "sum"
    assert plan_named(named, p, 4).meta["planner"]["objective"] == "exposed"


@pytest.mark.parametrize("op", ["encode", "decode", "merge", "decode_acc", "decode_more"])
def test_compute_scale_multiplies_every_compute_cost(op: str) -> None:
    p = _profile()
    q = replace(p, compute_scale=2.5)
    n = np.array([0.0, 1.0, 1e3, 1e6])
    assert np.allclose(q.compute_ms(op, n), 2.5 * p.compute_ms(op, n))
    assert q.compute_ms(op, 0) == 0.0


def test_compute_scale_by_size_interpolates_in_log_size() -> None:
    p = replace(_profile(), compute_scale=9.0, compute_scale_by_size=((1e3, 2.0), (1e5, 1.0)))
    n = np.array([1.0, 1e3, 1e4, 1e5, 1e8])
    assert np.allclose(p.scale_at(n), [2.0, 2.0, 1.5, 1.0, 1.0])  # replaces compute_scale
    base = replace(p, compute_scale=1.0, compute_scale_by_size=())
    assert np.allclose(p.compute_ms("encode", n), p.scale_at(n) * base.compute_ms("encode", n))
    q = Profile.from_json(p.to_json())
    assert q.compute_scale_by_size == ((1e3, 2.0), (1e5, 1.0)) and q.to_dict() == p.to_dict()
    for bad in (((1e5, 1.0), (1e3, 2.0)), ((1e3, 0.0),), ((0.5, 1.0),), ((1e3, float("nan")),)):
        with pytest.raises(ProfileError, match="compute_scale_by_size"):
            replace(p, compute_scale_by_size=bad)


def test_the_nan_check_costs_a_merge_unless_the_encode_reports_it() -> None:
    from hipress.compll import load
    from hipress.secopa.measure.timed_codec import TimedAlgorithm

    p = _profile()
    n = np.array([0.0, 1e3, 1e6])
    assert np.allclose(p.compute_ms("check", n), p.compute_ms("merge", n))
    q = replace(p, encode_checks_finite=True)
    assert np.allclose(q.compute_ms("check", n), 0.0)
    assert Profile.from_json(q.to_json()).encode_checks_finite
    d = json.loads(p.to_json())
    del d["encode_checks_finite"]  # older profiles: CaSync read every chunk
    assert not Profile.from_dict(d).encode_checks_finite
    # onebit's C encode reports it from its own pass; int8's first pass is a segment
    # reduction, it does not
    assert TimedAlgorithm(load("onebit", backend="cpu")).checks_finite()
    assert not TimedAlgorithm(load("int8", backend="cpu")).checks_finite()


def test_fitted_comm_round_trips_and_ignores_world_size() -> None:
    p = _profile()
    net = dict(p.network)
    net["gather"] = FittedComm(PiecewiseLinear((1.0, 1e6), (0.1, 1.1), 1e-6))
    net["bcast"] = FittedComm(AffineFloor(1e-6, 0.05, 0.1))
    q = Profile(p.algorithm, p.params, p.payload, p.compute, net, p.overlap, p.meta)
    r = Profile.from_json(q.to_json())
    assert float(r.network["bcast"].time(1e6, 8)) == pytest.approx(1.05)
    assert float(r.network["bcast"].time(1e6, 64)) == pytest.approx(1.05)


def test_with_link_replaces_only_the_network() -> None:
    p = _profile()
    q = p.with_link(12.5e9, 5e-6)
    assert q.compute == p.compute and q.payload == p.payload
    assert q.network["allreduce"] != p.network["allreduce"]
    assert q.meta["network_source"]["bandwidth_bytes_per_s"] == 12.5e9


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("compute"), "malformed profile"),
        (lambda d: d["compute"].pop("encode"), "lacks costs for \\['encode'\\]"),
        (lambda d: d["network"].pop("all_to_all"), "lacks costs for \\['all_to_all'\\]"),
        (lambda d: d.update(version=99), "version"),
        (lambda d: d.update(overlap=2.0), "overlap"),
        (lambda d: d.update(compute_scale=0.0), "compute_scale"),
        (lambda d: d.update(call_ms=-1.0), "call_ms"),
        (lambda d: d.update(call_ms=float("nan")), "call_ms"),
        (lambda d: d["network"]["allreduce"].update(kind="magic"), "unknown network op"),
        (lambda d: d["compute"]["merge"].update(kind="cubic"), "unknown cost function"),
        (lambda d: d.update(readiness={"leads": {}}), "malformed readiness"),
        (lambda d: d.update(readiness={"leads_ms": {"w": -1.0}}), "finite and >= 0"),
        (lambda d: d.update(readiness={"leads_ms": {"w": 1.0}, "steps": 0}), "steps"),
    ],
)
def test_malformed_profiles_are_rejected_with_a_reason(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    d = json.loads(_profile().to_json())
    mutate(d)
    with pytest.raises(ProfileError, match=message):
        Profile.from_dict(d)


def test_load_reports_missing_file_and_bad_json(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ProfileError, match="cannot read profile"):
        Profile.load(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(ProfileError, match="not valid JSON"):
        Profile.load(bad)
    good = tmp_path / "good.json"
    _profile().save(good)
    assert Profile.load(good).to_dict() == _profile().to_dict()
