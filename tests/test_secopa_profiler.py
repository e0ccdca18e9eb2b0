"""The profiler in one process: compute costs of real codecs, payload models, budgets."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from hipress.secopa.measure.comm import TorchComm
from hipress.secopa.measure.netprofiler import (
    fit_alpha_beta,
    matched_bytes,
    measure_network,
    measure_overlap,
)
from hipress.secopa.measure.profiler import build_profile, fit_payload, measure_compute
from hipress.secopa.measure.timed_codec import (
    TimedCallables,
    TimedCodecError,
    as_timed_codec,
    load_timed_codec,
    timed_cast,
)
from hipress.secopa.model.costfn import AffineFloor
from hipress.secopa.model.profile import (
    AlphaBeta,
    MeasuredComm,
    Profile,
    ProfileError,
    comm_op_from_dict,
    link_network,
)

SMALL = (256, 1024, 4096, 16384, 65536)


def _fp16_callables() -> TimedCallables:
    """Plain torch callables: a cast to fp16 viewed as bytes, and back."""
    return TimedCallables(
        "fp16-callables",
        encode=lambda x: x.to(torch.float16).view(torch.uint8),
        decode=lambda p, n: p.view(torch.float16)[:n].to(torch.float32),
        nbytes=lambda n: -(-2 * n // 8) * 8,
    )


@pytest.mark.parametrize("codec", [timed_cast("fp16"), _fp16_callables()], ids=["cast", "calls"])
def test_measure_compute_times_every_op(codec) -> None:  # type: ignore[no-untyped-def]
    samples = measure_compute(codec, sizes=SMALL, budget_s=0.5).samples
    want = {"encode", "decode", "merge"} | ({"decode_acc"} if codec.name == "fp16" else set())
    assert set(samples) == want
    for xs, ts in samples.values():
        assert len(xs) >= 2 and list(xs) == sorted(xs)
        assert all(t > 0 for t in ts)
    prof = build_profile(codec, measure_compute(codec, SMALL, 0.3), link_network(1e9, 1e-5))
    assert set(prof.meta["fit_error"]) == want
    assert Profile.from_json(prof.to_json()).to_dict() == prof.to_dict()
    # the fitted costs never decrease with size
    grid = np.geomspace(1, 1 << 24, 100)
    for op in prof.compute:
        assert np.all(np.diff(prof.compute_ms(op, grid)) >= -1e-12)


def test_max_size_replaces_the_larger_sizes() -> None:
    samples = measure_compute(timed_cast("fp16"), sizes=SMALL, budget_s=1.0, max_size=5000)
    assert samples.samples["encode"][0] == (256.0, 1024.0, 4096.0, 5000.0)


def test_budget_stops_before_expensive_sizes() -> None:
    def slow(x: torch.Tensor) -> torch.Tensor:
        time.sleep(x.numel() * 2e-7)  # 4M elements: 0.8 s per call
        return x.to(torch.float16).view(torch.uint8)

    codec = TimedCallables(
        "slow", slow, lambda p, n: p.view(torch.float16).float(), lambda n: 2 * n
    )
    samples = measure_compute(codec, budget_s=0.3).samples
    measured = samples["encode"][0]
    assert 2 <= len(measured) < 8 and measured[-1] < (1 << 22)


def test_payload_model_of_a_cast_is_exact() -> None:
    pm = fit_payload(timed_cast("fp16"))
    assert pm.bytes_per_element == 2.0 and pm.header == 0.0


def test_real_compll_algorithm_is_profiled() -> None:
    codec = load_timed_codec("terngrad", {"bitwidth": 2})
    samples = measure_compute(codec, sizes=SMALL[:3], budget_s=0.5).samples
    # CompLL decodes with accumulate=True, and averages payloads with decode_sum, as CaSync
    assert {"decode_acc", "decode_sum2"} <= set(samples)
    pm = fit_payload(codec)
    for n in (1000, 4096, 123_457, 1 << 20):
        assert abs(float(pm.nbytes(n)) - codec.payload_nbytes(n)) <= 8
    assert pm.bytes_per_element == pytest.approx(0.25)


def test_alpha_beta_fit_recovers_a_ring_allreduce() -> None:
    n, alpha, beta = 4, 0.05, 2e-6
    sizes = [1e3, 1e4, 1e5, 1e6, 1e7]
    times = [2 * (n - 1) * alpha + 2 * (n - 1) / n * b * beta for b in sizes]
    op = fit_alpha_beta("allreduce", sizes, times, n, "ring_allreduce")
    assert op.alpha_ms == pytest.approx(alpha) and op.beta_ms_per_byte == pytest.approx(beta)


def test_non_codecs_are_rejected() -> None:
    with pytest.raises(TimedCodecError, match="neither a TimedCodec nor a CompLL algorithm"):
        as_timed_codec(object())
    with pytest.raises(TimedCodecError, match="cannot load algorithm 'no-such-algorithm'"):
        load_timed_codec("no-such-algorithm")


def test_profile_in_the_original_affine_floor_form_is_saved_as_json(tmp_path) -> None:  # type: ignore[no-untyped-def]
    codec = timed_cast("fp16")
    samples = measure_compute(codec, SMALL, 0.3)
    prof = build_profile(codec, samples, link_network(1e9, 1e-5), form="affine_floor")
    assert prof.meta["form"] == "affine_floor"
    for op, fn in prof.compute.items():
        assert isinstance(fn, AffineFloor), op
        _, ts = samples.samples[op]
        assert fn.floor == pytest.approx(min(ts))  # the floor is the fastest measurement
        assert set(prof.meta["fit_error"][op]) == {"piecewise", "affine_floor"}
    path = tmp_path / "profile.json"
    prof.save(path)
    again = Profile.load(path)
    assert again.to_dict() == prof.to_dict()
    assert all(isinstance(fn, AffineFloor) for fn in again.compute.values())
    assert '"kind": "affine_floor"' in path.read_text()
    with pytest.raises(ProfileError, match="unknown cost form"):
        build_profile(codec, samples, link_network(1e9, 1e-5), form="cubic")


def test_network_measurement_without_a_group_says_so() -> None:
    with pytest.raises(ProfileError, match="TorchComm needs an initialised"):
        TorchComm()
    with pytest.raises(ProfileError, match="measure_network needs an initialised process group"):
        measure_network()
    with pytest.raises(ProfileError, match="measure_overlap needs an initialised process group"):
        measure_overlap(timed_cast("fp16"))


def test_measured_collective_keeps_its_samples_at_its_world_size() -> None:
    # a 100 Mbit/s shaped all_to_all (2 ranks): the alpha-beta line misses 8 MiB by ~9x
    xs = (1024.0, 16384.0, 262144.0, 2097152.0, 8388608.0)
    ts = (0.143, 0.167, 11.83, 165.7, 692.0)
    fit = fit_alpha_beta("all_to_all", xs, ts, 2, "pairwise_alltoall")
    model = AlphaBeta(fit.alpha_ms, fit.beta_ms_per_byte, ("pairwise_alltoall",))
    op = MeasuredComm(2, xs, ts, model)
    assert float(model.time(xs[-1], 2)) < 0.5 * ts[-1]  # what the line alone would predict
    assert op.time(np.array(xs), 2) == pytest.approx(ts)  # exact at the samples
    mid = float(op.time(5_000_000, 2))
    assert ts[3] < mid < ts[4]
    last = (ts[4] - ts[3]) / (xs[4] - xs[3])  # above the samples: the last segment's slope
    assert float(op.time(2 * xs[4], 2)) == pytest.approx(ts[4] + last * xs[4])
    assert float(op.time(10, 2)) == pytest.approx(ts[0])
    # other world sizes extrapolate with the alpha-beta model
    assert float(op.time(1 << 20, 8)) == pytest.approx(float(model.time(1 << 20, 8)))
    assert op.slopes(8) == model.slopes(8)
    lo, hi = op.slopes(2)
    assert 0.0 <= lo <= hi
    bandwidth = [(ts[i + 1] - ts[i]) / (xs[i + 1] - xs[i]) for i in (2, 3)]  # from 11.8 ms
    assert (lo, hi) == pytest.approx((min(bandwidth), max(bandwidth)))
    # loopback: latency-flat small sizes (made monotone: slope 0) are not a free byte
    loop = MeasuredComm(2, xs, (0.66, 0.49, 0.60, 3.38, 9.8), model)
    assert loop.slopes(2)[0] == pytest.approx((9.8 - 3.38) / (xs[4] - xs[3]))
    assert loop.slopes(2)[0] > 0
    # non-decreasing even if a larger size measured faster (noise)
    noisy = MeasuredComm(2, (1.0, 2.0, 3.0), (5.0, 4.0, 6.0), model)
    assert list(noisy.time(np.array([1.0, 2.0, 3.0]), 2)) == [5.0, 5.0, 6.0]
    assert comm_op_from_dict(op.to_dict()) == op
    with pytest.raises(ProfileError, match="increasing"):
        MeasuredComm(2, (2.0, 1.0), (1.0, 2.0), model)


def test_overlap_is_measured_against_an_all_gather_as_long_as_the_encode() -> None:
    """At 100 Mbit/s a 1 MB all_gather takes ~80 ms; against a 0.4 ms encode that measures
    only timer noise. The matched size is the one whose predicted time is closest."""
    link = link_network(12.5e6, 50e-6)["all_gather"]  # 100 Mbit/s
    for ms in (0.05, 0.4, 3.0, 80.0):
        b = matched_bytes(link, 2, ms)
        t = float(link.time(b, 2))
        for other in (b // 2, b * 2):
            if 1 << 10 <= other <= 1 << 23:
                assert abs(np.log(t / ms)) <= abs(np.log(float(link.time(other, 2)) / ms))
    assert matched_bytes(link, 2, 1e9) == 1 << 23  # clipped to the measured range
    assert matched_bytes(link, 2, 1e-9) == 1 << 10
