"""Local-step training reaches a loss close to uncompressed local steps on a small task, with
compressed outer gradients (error feedback on), and every rank ends with the same weights."""

from __future__ import annotations

import diloco_workers as w
import pytest
from dist_utils import run_workers

STEPS = 96  # 12 outer syncs at H = 8
SGD = {"lr": 1.0}  # the default outer optimizer of a codec with error feedback


@pytest.fixture(scope="module")
def baseline() -> tuple[float, float]:
    start = run_workers(w.train_loss, 2, {"sync_every": 8}, 0)[0]
    done = run_workers(w.train_loss, 2, {"sync_every": 8, "outer": SGD}, STEPS)
    assert done[0] == done[1]
    return start, done[0]


@pytest.mark.parametrize(("algorithm", "params"), [
    ("onebit", None), ("topk", {"ratio": 0.25}), ("int8", None), ("terngrad", None),
])  # fmt: skip
def test_compressed_outer_sync_trains_close_to_uncompressed(algorithm, params, baseline) -> None:  # type: ignore[no-untyped-def]
    start, plain = baseline
    assert plain < 0.2 * start  # the task is learned
    kw = {"sync_every": 8, "algorithm": algorithm, "params": params, "outer": SGD}
    got = run_workers(w.train_loss, 2, kw, STEPS)
    assert got[0] == got[1]
    assert got[0] < 1.15 * plain, (algorithm, got[0], plain, start)


def test_with_error_feedback_the_default_outer_step_has_no_momentum() -> None:
    # with Nesterov momentum 0.9 the same run ends far worse (about 4x the loss here): error
    # feedback and momentum both re-apply what earlier syncs left out
    default = run_workers(w.train_loss, 2, {"sync_every": 8, "algorithm": "onebit"}, STEPS)
    explicit = run_workers(w.train_loss, 2, {"sync_every": 8, "algorithm": "onebit",
                                              "outer": SGD}, STEPS)  # fmt: skip
    nesterov = {"lr": 0.7, "momentum": 0.9, "nesterov": True}
    worse = run_workers(w.train_loss, 2, {"sync_every": 8, "algorithm": "onebit",
                                           "outer": nesterov}, STEPS)  # fmt: skip
    assert default == explicit
    assert worse[0] > 2 * default[0]
