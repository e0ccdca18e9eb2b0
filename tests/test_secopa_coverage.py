"""What a plan's costs rest on (:mod:`hipress.secopa.model.coverage`)."""

from __future__ import annotations

from hipress.secopa.model.costfn import fit_piecewise
from hipress.secopa.model.coverage import FAR, cost_sources, far_extrapolations
from hipress.secopa.model.network import AlphaBeta, MeasuredComm
from hipress.secopa.model.profile import affine_profile


def _profile(top: float = 65536.0):  # type: ignore[no-untyped-def]
    base = affine_profile(
        "terngrad",
        encode=(2e-7, 0.02, 0.02),
        decode=(1e-7, 0.01, 0.01),
        merge=(5e-8, 0.005, 0.005),
        bytes_per_element=0.25,
        header=16,
    )
    xs = [256.0, 4096.0, top]
    fn = fit_piecewise(xs, [0.01, 0.05, 1.0])
    ar = MeasuredComm(
        2, (1024.0, 8.0 * 2**20), (0.1, 9.0), AlphaBeta(0.01, 1e-6, ("ring_allreduce",))
    )
    compute = {"encode": fn, "decode": fn, "merge": base.compute["merge"]}
    return base.__class__(**{**base.__dict__, "compute": compute,
                             "network": {**base.network, "allreduce": ar}})  # fmt: skip


def test_sources_give_the_measured_range_and_the_factor() -> None:
    src = {s.cost: s for s in cost_sources(_profile(), 102_760_448)}
    enc = src["encode"]
    assert (enc.kind, enc.lo, enc.hi, enc.unit) == ("measured", 256.0, 65536.0, "elements")
    assert round(enc.factor) == 1568
    assert src["merge"].kind == "fit" and src["merge"].factor == 1.0  # constants: no range
    ar = src["allreduce"]
    assert (ar.kind, ar.measured_world, ar.hi) == ("measured", 2, 8.0 * 2**20)
    assert ar.needed == 4 * 102_760_448  # float32, uncompressed
    assert src["all_gather"].kind == "link" and src["all_gather"].factor == 1.0
    assert src["all_gather"].needed == 0.25 * 102_760_448 + 16  # the payload


def test_far_extrapolations_only_beyond_the_threshold() -> None:
    near = cost_sources(_profile(), int(65536 * FAR))
    assert [s.cost for s in far_extrapolations(near)] == []
    far = far_extrapolations(cost_sources(_profile(), int(65536 * FAR) + 1024))
    assert [s.cost for s in far] == ["encode", "decode"]
    covered = cost_sources(_profile(top=2.0**27), 102_760_448)
    assert [s.cost for s in far_extrapolations(covered)] == ["allreduce"]
