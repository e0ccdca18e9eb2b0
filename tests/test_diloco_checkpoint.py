"""A DiLoCo checkpoint resumes bit for bit (anchors, outer optimizer, error feedback, counters,
a sync in flight), and a foreign or damaged one is refused without changing anything."""

from __future__ import annotations

import diloco_workers as w
import pytest
import torch
from dist_utils import run_workers

CASES = {
    "onebit": {"sync_every": 4, "algorithm": "onebit"},
    "terngrad": {"sync_every": 4, "algorithm": "terngrad"},  # random: the RNG counters resume
    "none": {"sync_every": 4},
    # streaming: two fragments, each sync overlapping a step: step 6 saves fragment 1's in flight
    "streaming": {"sync_every": 4, "algorithm": "topk", "params": {"ratio": 0.3},
                  "fragments": 2, "fragment_sync_delay": 1, "fragment_update_alpha": 0.5},
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_resume_is_bit_exact(case: str) -> None:
    kw, stop, total, world = CASES[case], 6, 13, 2 if case != "onebit" else 4
    straight = run_workers(w.resume, world, kw, stop, total, None)
    resumed = run_workers(w.resume, world, kw, stop, total, [s["saved"] for s in straight])
    for a, b in zip(straight, resumed, strict=True):
        assert a["syncs"] == b["syncs"] and a["inner_steps"] == b["inner_steps"] == total
        assert sum(a["syncs"]) >= 3
        assert b["saved"] == b""  # the resumed run saved nothing: it started after `stop`
        for x, y in zip(a["params"], b["params"], strict=True):
            assert torch.equal(x, y)


def test_resuming_without_the_diloco_state_is_not_the_same_run() -> None:
    # the control for the test above: the DiLoCo state is what makes the resume exact
    kw = CASES["onebit"]
    straight = run_workers(w.resume, 2, kw, 6, 13, None)
    blind = run_workers(w.resume, 2, kw, 6, 13, [s["saved"] for s in straight], False)
    assert not all(torch.equal(x, y) for x, y in
                   zip(straight[0]["params"], blind[0]["params"], strict=True))  # fmt: skip


def test_foreign_or_damaged_state_dicts_are_refused_and_change_nothing() -> None:
    msgs = run_workers(w.load_errors, 2)[0]
    assert len(msgs) == 6, msgs
    assert "not a DiLoCo state dict" in msgs[0]
    assert "load each rank's own state dict" in msgs[1]
    assert "another configuration" in msgs[2]
    assert "anchor of 0.weight does not fit" in msgs[3]
    assert "2.bias" in msgs[4] and "codec state does not fit" in msgs[4]
    assert "damaged DiLoCo state dict: no anchors" in msgs[5]
