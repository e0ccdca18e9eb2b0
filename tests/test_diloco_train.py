"""Local-step training reaches a loss close to uncompressed local steps on a small task, with
compressed outer gradients (error feedback on), and every rank ends with the same weights."""

from __future__ import annotations

import diloco_workers as w
import pytest
from dist_utils import run_workers

STEPS = 96  # 12 outer syncs at H = 8
SGD = {"lr": 1.0}  # model averaging: no momentum
NESTEROV = {"lr": 0.7, "momentum": 0.9, "nesterov": True}
HALF = {"lr": 1.0, "momentum": 0.5, "nesterov": True}  # the default with error feedback
ALGORITHMS = {"onebit": None, "topk": {"ratio": 0.25}, "int8": None, "terngrad": None}

# every run of this module, in one launch of 2 ranks: name -> (DiLoCo keywords, inner steps)
RUNS = {
    "start": ({"sync_every": 8}, 0),
    "plain": ({"sync_every": 8, "outer": SGD}, STEPS),
    **{a: ({"sync_every": 8, "algorithm": a, "params": p, "outer": SGD}, STEPS)
       for a, p in ALGORITHMS.items()},
    "onebit default outer": ({"sync_every": 8, "algorithm": "onebit"}, STEPS),
    "onebit half momentum": ({"sync_every": 8, "algorithm": "onebit", "outer": HALF}, STEPS),
    "onebit nesterov": ({"sync_every": 8, "algorithm": "onebit", "outer": NESTEROV}, STEPS),
}  # fmt: skip


@pytest.fixture(scope="module")
def losses() -> dict[str, tuple[float, float]]:
    """Each run's final loss on rank 0 and rank 1."""
    got = run_workers(w.each, 2, [("train_loss", kw) for kw in RUNS.values()], timeout=300)
    return {name: (got[0][i], got[1][i]) for i, name in enumerate(RUNS)}


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_compressed_outer_sync_trains_close_to_uncompressed(algorithm, losses) -> None:  # type: ignore[no-untyped-def]
    start, plain = losses["start"][0], losses["plain"]
    assert plain[0] == plain[1]
    assert plain[0] < 0.2 * start  # the task is learned
    got = losses[algorithm]
    assert got[0] == got[1]
    assert got[0] < 1.15 * plain[0], (algorithm, got[0], plain[0], start)


def test_with_error_feedback_the_default_outer_step_has_half_momentum(losses) -> None:  # type: ignore[no-untyped-def]
    # with DiLoCo's momentum 0.9 the same run ends far worse (about 4x the loss here): error
    # feedback and momentum both re-apply what earlier syncs left out; 0.5 is as good as none
    default = losses["onebit default outer"]
    assert default == losses["onebit half momentum"]
    assert losses["onebit nesterov"][0] > 2 * default[0]
    assert default[0] < 1.15 * losses["plain"][0]
