"""Bad arguments, ranks configured differently, a peer that dies and NaN: each ends in a typed
error with a clear message (or a NaN that stays NaN), never a hang or a silent mix."""

from __future__ import annotations

from typing import Any

import diloco_workers as w
import pytest
import torch
from dist_utils import run_workers
from torch import nn

from hipress.diloco import DiLoCo, DiLoCoError


def test_without_a_process_group_the_error_says_what_to_call() -> None:
    model = nn.Linear(2, 2)
    with pytest.raises(DiLoCoError, match="init_process_group"):
        DiLoCo(model, torch.optim.SGD(model.parameters(), lr=0.1), sync_every=4)


def test_bad_arguments_name_what_is_wrong() -> None:
    msgs = run_workers(w.bad_arguments, 1)[0]
    expected = [
        "sync_every must be an integer >= 1",
        "cannot load algorithm 'nope'",
        "cannot load algorithm 'topk'",
        "fragment_sync_delay must be an integer from 0 to 1",
        "sync_every=1 is less than the 2 fragments",
        "fragment_update_alpha must be in [0, 1]",
        "outer_optimizer must hold exactly the model's trainable parameters",
        "outer_optimizer must be another optimizer",
        "onebit keeps its own error feedback",
        "feedback must be one of auto, none, fp32",
        "is in fragments 0 and 1",
        "no fragment holds 2.weight and 1 more",
        "the algorithm mapping must name every trainable parameter once",
        "2.weight is a plain tensor and 0.weight a DTensor",
        "step() inside `with diloco:` counts each inner step twice",
    ]
    assert len(msgs) == len(expected), msgs
    for got, want in zip(msgs, expected, strict=True):
        assert want in got, (want, got)


MISMATCHES = [
    ({"sync_every": 8}, "sync_every=8"),
    ({"algorithm": "topk"}, "topk"),
    ({"fragment_update_alpha": 0.5}, "alpha=0.5"),
]
NAN_ALGORITHMS = [None, "onebit", "int8"]


@pytest.fixture(scope="module")
def two_ranks() -> dict[Any, list[Any]]:
    """The runs of the mismatch and NaN cases, in one launch of 2 ranks: case -> each rank's
    result (a mismatch case is keyed by its shown text, a NaN case by its algorithm)."""
    calls = {shown: ("mismatch", (kw,)) for kw, shown in MISMATCHES}
    calls.update({("nan", a): ("nan_rounds", (a,)) for a in NAN_ALGORITHMS})
    got = run_workers(w.each, 2, list(calls.values()), timeout=300)
    return {key: [g[i] for g in got] for i, key in enumerate(calls)}


@pytest.mark.parametrize(("kw", "shown"), MISMATCHES)
def test_ranks_that_disagree_all_raise_config_mismatch(kw, shown, two_ranks) -> None:  # type: ignore[no-untyped-def]
    msgs = two_ranks[shown]
    assert len(msgs) == 2
    for m in msgs:
        assert "DiLoCo ranks disagree" in m and "rank 0: as rank 0" in m and shown in m, m


def test_a_dead_peer_ends_the_others_with_comm_error() -> None:
    got = run_workers(w.dead_peer, 4, 3, pg_timeout=10.0, timeout=90.0)
    assert got[3] is None  # the rank that left
    for r in range(3):
        assert got[r]["error"] is not None, r
        assert "outer sync of fragment 0 at inner step 3" in got[r]["error"]
        assert "resume all of them from the last checkpoint" in got[r]["error"]


@pytest.mark.parametrize("algorithm", NAN_ALGORITHMS)
def test_nan_in_an_outer_gradient_never_becomes_finite(algorithm, two_ranks) -> None:  # type: ignore[no-untyped-def]
    got = two_ranks[("nan", algorithm)]
    for g in got:
        assert [f["0.weight"] for f in g["finite"]] == [False, False]  # every rank, both syncs
        assert g["finite"][0]["2.weight"] and g["finite"][0]["2.bias"]  # the others unharmed
        assert g["nan_weights"] >= 1
