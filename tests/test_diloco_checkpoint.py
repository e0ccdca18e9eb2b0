"""A DiLoCo checkpoint resumes bit for bit (anchors, outer optimizer, error feedback, counters,
a sync in flight), and a foreign or damaged one is refused without changing anything."""

from __future__ import annotations

from typing import Any

import diloco_workers as w
import pytest
import torch
from dist_utils import run_workers

from hipress.diloco.config import OUTER_FEEDBACK

CASES = {
    "onebit": {"sync_every": 4, "algorithm": "onebit"},
    "terngrad": {"sync_every": 4, "algorithm": "terngrad"},  # random: the RNG counters resume
    "none": {"sync_every": 4},
    # streaming: two fragments, each sync overlapping a step: step 6 saves fragment 1's in flight
    "streaming": {"sync_every": 4, "algorithm": "topk", "params": {"ratio": 0.3},
                  "fragments": 2, "fragment_sync_delay": 1, "fragment_update_alpha": 0.5},
}  # fmt: skip


# the default outer optimizer as torch's per-tensor loop: a checkpoint of it resumes under the
# default (foreach), whose digest must not tell them apart
PER_TENSOR = {"sync_every": 4, "algorithm": "onebit", "outer": {**OUTER_FEEDBACK, "foreach": False}}

STOP, TOTAL = 6, 13
WORLD = {case: 4 if case == "onebit" else 2 for case in CASES}


@pytest.fixture(scope="module")
def runs() -> dict[str, list[Any]]:
    """Every run of this module, one launch per world size and phase: each case trained
    straight through (saving at STOP), then resumed from what it saved (and onebit at two
    ranks resumed without its DiLoCo state, the control), and the refused loads."""
    first: dict[int, dict[str, tuple[Any, ...]]] = {2: {"errors": ("load_errors", ())}, 4: {}}
    for case, kw in CASES.items():
        first[WORLD[case]][f"straight {case}"] = ("resume", (kw, STOP, TOTAL, None))
    first[2]["straight control"] = ("resume", (CASES["onebit"], STOP, TOTAL, None))
    first[2]["straight per-tensor"] = ("resume", (PER_TENSOR, STOP, TOTAL, None))
    out = _launch(first)
    second: dict[int, dict[str, tuple[Any, ...]]] = {2: {}, 4: {}}
    for case, kw in CASES.items():
        saved = [s["saved"] for s in out[f"straight {case}"]]
        second[WORLD[case]][f"resumed {case}"] = ("resume", (kw, STOP, TOTAL, saved))
    saved = [s["saved"] for s in out["straight control"]]
    second[2]["blind control"] = ("resume", (CASES["onebit"], STOP, TOTAL, saved, False))
    saved = [s["saved"] for s in out["straight per-tensor"]]
    default = {k: v for k, v in PER_TENSOR.items() if k != "outer"}
    second[2]["resumed per-tensor"] = ("resume", (default, STOP, TOTAL, saved))
    return {**out, **_launch(second)}


def _launch(cases: dict[int, dict[str, tuple[Any, ...]]]) -> dict[str, list[Any]]:
    out = {}
    for world, mine in cases.items():
        if mine:
            got = run_workers(w.each, world, list(mine.values()), timeout=300)
            out.update({key: [g[i] for g in got] for i, key in enumerate(mine)})
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_resume_is_bit_exact(case: str, runs: dict[str, list[Any]]) -> None:
    straight, resumed = runs[f"straight {case}"], runs[f"resumed {case}"]
    assert len(straight) == len(resumed) == WORLD[case]
    for a, b in zip(straight, resumed, strict=True):
        assert a["syncs"] == b["syncs"] and a["inner_steps"] == b["inner_steps"] == TOTAL
        assert sum(a["syncs"]) >= 3
        assert b["saved"] == b""  # the resumed run saved nothing: it started after `stop`
        for x, y in zip(a["params"], b["params"], strict=True):
            assert torch.equal(x, y)


def test_a_checkpoint_of_the_per_tensor_outer_step_resumes_under_the_default(
    runs: dict[str, list[Any]],
) -> None:
    # foreach=True (the default since) computes the same bits and keeps the config digest
    for a, b in zip(runs["straight per-tensor"], runs["resumed per-tensor"], strict=True):
        assert a["syncs"] == b["syncs"] and sum(a["syncs"]) >= 3
        for x, y in zip(a["params"], b["params"], strict=True):
            assert torch.equal(x, y)


def test_resuming_without_the_diloco_state_is_not_the_same_run(runs: dict[str, list[Any]]) -> None:
    # the control for the test above: the DiLoCo state is what makes the resume exact
    straight, blind = runs["straight control"], runs["blind control"]
    assert not all(torch.equal(x, y) for x, y in
                   zip(straight[0]["params"], blind[0]["params"], strict=True))  # fmt: skip


def test_foreign_or_damaged_state_dicts_are_refused_and_change_nothing(
    runs: dict[str, list[Any]],
) -> None:
    msgs = runs["errors"][0]
    assert len(msgs) == 6, msgs
    assert "not a DiLoCo state dict" in msgs[0]
    assert "load each rank's own state dict" in msgs[1]
    assert "another configuration" in msgs[2]
    assert "anchor of 0.weight does not fit" in msgs[3]
    assert "2.bias" in msgs[4] and "codec state does not fit" in msgs[4]
    assert "damaged DiLoCo state dict: no anchors" in msgs[5]
