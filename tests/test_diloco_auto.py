"""plan="auto" for DiLoCo: SeCoPa's per-fragment choice (hipress.secopa.model.localsteps) and
DiLoCo running it on a real 2-process gloo group."""

from __future__ import annotations

import diloco_workers as w
import pytest
import torch
from dist_utils import run_workers

from hipress.secopa.model.localsteps import plan_local_steps
from hipress.secopa.model.profile import affine_profile

# a slow link and a codec with 10 ms of fixed cost: compressing pays only for larger fragments
PROFILE = affine_profile("onebit", encode=(0, 10, 10), decode=(0, 4, 4), merge=(0, 0, 0),
                         bytes_per_element=1 / 8, header=8, bandwidth_bytes_per_s=16000,
                         latency_s=1e-4)  # fmt: skip


def test_each_fragment_takes_what_leaves_least_exposed() -> None:
    plan = plan_local_steps(PROFILE, 2, [100_000, 144, 68], 16)
    assert [c.compress for c in plan.fragments] == [True, True, False]
    assert [c.strategy for c in plan.fragments] == ["allgather", "allgather", "allreduce"]
    for c in plan.fragments:
        assert c.exposed_ms == min(c.plain_ms, c.compressed_ms)
    assert plan.utilisation is None and "unknown" in plan.line()
    assert plan == plan_local_steps(PROFILE, 2, [100_000, 144, 68], 16)  # deterministic
    # 3 steps of 15 ms hide the small fragments' syncs: then they go uncompressed
    hidden = plan_local_steps(PROFILE, 2, [100_000, 144, 68], 16, delay=3, step_ms=15.0)
    assert [c.compress for c in hidden.fragments] == [True, False, False]
    exposed = hidden.fragments[0].compressed_ms - 45.0
    assert hidden.utilisation == pytest.approx(240.0 / (240.0 + exposed))
    with pytest.raises(ValueError, match="sync_every"):
        plan_local_steps(PROFILE, 2, [10], 0)


def test_diloco_runs_the_auto_choice_per_fragment() -> None:
    """No compute time passed in: the first period's inner steps are timed for the forecast."""
    got = run_workers(w.auto, 2, None)
    for r in got:
        # fragment 0 (the first layer, 144 elements) compressed, fragment 1 (68) not
        assert r["compress"] == [True, False]
        assert r["codecs"] == {"0.weight": "onebit", "0.bias": "onebit", "2.weight": "none",
                               "2.bias": "none"}  # fmt: skip
        assert 0 < r["utilisation"] < 1
    for a, b in zip(got[0]["anchors"], got[1]["anchors"], strict=True):
        assert torch.equal(a, b)
