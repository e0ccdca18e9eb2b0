"""Streaming DiLoCo (fragments synced on a stagger, each overlapping inner steps, mixed with
alpha) and replicas of several processes (DDP inside, DiLoCo across), in real gloo groups."""

from __future__ import annotations

from typing import Any

import diloco_workers as w
import pytest
import torch
from dist_utils import run_workers
from torch import nn

from hipress.diloco.fragments import Schedule, split_fragments


def test_the_schedule_staggers_fragments_and_applies_tau_steps_later() -> None:
    s = Schedule.checked(8, 4, 1)
    assert [s.starts(t) for t in range(1, 9)] == [[], [0], [], [1], [], [2], [], [3]]
    assert [s.applies(t) for t in range(1, 10)] == [[], [], [0], [], [1], [], [2], [], [3]]
    one = Schedule.checked(3, 1, 0)
    assert [t for t in range(1, 10) if one.starts(t) == one.applies(t) == [0]] == [3, 6, 9]


def test_a_count_of_fragments_splits_by_size_in_model_order() -> None:
    m = nn.Sequential(nn.Linear(100, 100), nn.Linear(100, 10), nn.Linear(10, 10))
    named = list(m.named_parameters())
    assert split_fragments(named, 2) == [[0], [1, 2, 3, 4, 5]]
    assert split_fragments(named, 6) == [[i] for i in range(6)]
    assert split_fragments(named, [m[2], m[0], m[1]]) == [[4, 5], [0, 1], [2, 3]]


ALPHAS = [0.0, 0.5]
REPLICA_ALGORITHMS = [None, "onebit"]


@pytest.fixture(scope="module")
def runs() -> dict[Any, list[Any]]:
    """Every run of this module, one launch per world size: the streaming runs at 2 ranks
    (keyed by alpha, and "onebit"), the replica runs at 4 (keyed by ("replicas", algorithm))."""
    cases: dict[int, dict[Any, tuple[Any, ...]]] = {2: {}, 4: {}}
    cases[2].update({alpha: ("streaming", (alpha,)) for alpha in ALPHAS})
    cases[2]["onebit"] = ("streaming", (0.0, "onebit"))
    cases[4].update({("replicas", a): ("replicas", (a, 8)) for a in REPLICA_ALGORITHMS})
    out = {}
    for world, mine in cases.items():
        got = run_workers(w.each, world, list(mine.values()), timeout=300)
        out.update({key: [g[i] for g in got] for i, key in enumerate(mine)})
    return out


@pytest.mark.parametrize("alpha", ALPHAS)
def test_streaming_applies_the_mean_sent_tau_steps_earlier_and_mixes_by_alpha(
    alpha: float, runs: dict[Any, list[Any]]
) -> None:
    got = runs[alpha]
    frags = got[0][0]["frags"]
    applied = 0
    for t, rec in enumerate(got[0]):
        for k in rec["applies"]:
            assert t >= 1 and k in got[0][t - 1]["starts"]  # started one step earlier
            sent = [(got[0][t - 1]["sent"][i] + got[1][t - 1]["sent"][i]) / 2 for i in frags[k]]
            for i, mean in zip(frags[k], sent, strict=True):
                want = rec["anchors_before"][i] - mean.view_as(rec["anchors_before"][i])
                assert torch.equal(rec["anchors"][i], want)  # outer SGD lr 1 on the mean
                mixed = want.lerp(rec["before"][i], alpha) if alpha else want
                assert torch.equal(rec["after"][i], mixed)
                assert not torch.equal(rec["before"][i], got[0][t - 1]["before"][i])  # overlap
            applied += 1
        untouched = [i for f, idx in enumerate(frags) if f not in rec["applies"] for i in idx]
        for i in untouched:
            assert torch.equal(rec["after"][i], rec["before"][i])
    assert applied == 5  # fragment 0 starts at 2, 6, 10; fragment 1 at 4, 8, 12 (applied at 13)
    for r in range(2):  # at alpha 0 every rank holds the global weights of a fragment just applied
        for t, rec in enumerate(got[r]):
            for k in rec["applies"]:
                for i in frags[k]:
                    assert torch.equal(rec["anchors"][i], got[0][t]["anchors"][i])


def test_streaming_with_a_codec_keeps_ranks_in_step(runs: dict[Any, list[Any]]) -> None:
    got = runs["onebit"]
    for a, b in zip(got[0][-1]["anchors"], got[1][-1]["anchors"], strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("algorithm", REPLICA_ALGORITHMS)
def test_replicas_of_two_ranks_ddp_inside_diloco_across(algorithm, runs) -> None:  # type: ignore[no-untyped-def]
    got = runs[("replicas", algorithm)]
    for step in range(8):
        ws = [g["weights"][step] for g in got]
        assert torch.equal(ws[0], ws[1]) and torch.equal(ws[2], ws[3])  # DDP inside
        if (step + 1) % 4 == 0:
            assert torch.equal(ws[0], ws[2])  # after each outer sync: one model
        else:
            assert not torch.equal(ws[0], ws[2])  # between syncs replicas drift apart
    assert all(g["syncs"] == 2 for g in got)
