"""FSDP2 inside a replica: two replicas of two ranks (and of one), each FSDP2-sharded over its
own ranks, DiLoCo across them per shard, in real gloo groups. Uncompressed it gives the same
weights, bit for bit, as DDP inside each replica; onebit trains; checkpoints resume bit for
bit; plan="auto" plans per shard; groups that pair different shards and other layouts are
refused."""

from __future__ import annotations

from typing import Any

import diloco_workers as w
import pytest
import torch
from dist_utils import run_workers

NONE = {"sync_every": 4}
STREAMING = {"sync_every": 4, "fragments": 2, "fragment_sync_delay": 1,
             "fragment_update_alpha": 0.5}  # fmt: skip
ONEBIT = {"sync_every": 4, "algorithm": "onebit"}
RESUMED = {**STREAMING, "algorithm": "onebit"}  # step 6 saves a sync in flight


@pytest.fixture(scope="module")
def runs() -> dict[Any, list[Any]]:
    """Every case of this module: one launch at four ranks (2 replicas x 2 shards), one at
    two (2 replicas x 1 shard)."""
    cases: dict[int, dict[Any, tuple[Any, ...]]] = {4: {}, 2: {}}
    for world in (4, 2):
        for name, kw in (("none", NONE), ("streaming", STREAMING)):
            for fsdp in (True, False):
                cases[world][(world, name, fsdp)] = ("fsdp_vs_ddp", (fsdp, kw, 8))
    cases[4]["onebit"] = ("fsdp_vs_ddp", (True, ONEBIT, 24))
    cases[4]["resume"] = ("fsdp_resume", (RESUMED, 6, 13))
    cases[4]["errors"] = ("fsdp_errors", ())
    cases[4]["auto"] = ("fsdp_auto", ())
    out = {}
    for world, mine in cases.items():
        got = run_workers(w.each, world, list(mine.values()), timeout=300)
        for i, key in enumerate(mine):
            out[key] = [g[i] for g in got]
    return out


@pytest.mark.parametrize("world", [4, 2])
@pytest.mark.parametrize("case", ["none", "streaming"])
def test_uncompressed_fsdp_equals_ddp_bit_for_bit(world, case, runs) -> None:  # type: ignore[no-untyped-def]
    fsdp, ddp = runs[(world, case, True)], runs[(world, case, False)]
    for a, b in zip(fsdp, ddp, strict=True):
        assert a["syncs"] == b["syncs"] > 0
        assert len(a["weights"]) == len(b["weights"]) > 0
        for wa, wb in zip(a["weights"], b["weights"], strict=True):
            for x, y in zip(wa, wb, strict=True):
                assert torch.equal(x, y)
    if case == "none":  # after a sync every rank holds the global weights (alpha 0)
        for r in fsdp[1:]:
            last = zip(r["weights"][-1], fsdp[0]["weights"][-1], strict=True)
            assert all(torch.equal(x, y) for x, y in last)


def test_onebit_per_shard_trains(runs) -> None:  # type: ignore[no-untyped-def]
    got = runs["onebit"]
    for r in got:
        first, last = r["held"]
        assert last < 0.5 * first, r["held"]
        assert r["syncs"] == 6
    # the error feedback is per shard: this rank's rows (15 rows split 8 / 7)
    assert got[0]["owed"]["0.weight"].numel() == 8 * 8
    assert got[1]["owed"]["0.weight"].numel() == 7 * 8


def test_resume_is_bit_exact(runs) -> None:  # type: ignore[no-untyped-def]
    assert runs["resume"] == [True] * 4


def test_bad_layouts_are_refused(runs) -> None:  # type: ignore[no-untyped-def]
    for msgs in runs["errors"]:
        world, pairs_replica, mixed = msgs
        for wrong in (world, pairs_replica):
            assert wrong.startswith("ConfigMismatchError: the process_group pairs different "
                                    "shards"), wrong  # fmt: skip
        assert "rows 0..8" in world and "rows 8..15" in world
        assert mixed.startswith("DiLoCoError: 2.weight is a plain tensor and 0.weight a DTensor")


def test_plan_auto_per_shard(runs) -> None:  # type: ignore[no-untyped-def]
    got = runs["auto"]
    # the ranks that hold the same shard (0 and 2, 1 and 3) agree on each fragment's codec
    assert got[0]["codecs"] == got[2]["codecs"] and got[1]["codecs"] == got[3]["codecs"]
    assert {c for r in got for c in r["codecs"].values()} <= {"onebit", "none"}
    assert [r["syncs"] for r in got] == [2] * 4
    for a, b in ((0, 2), (1, 3)):  # the global rows agree across replicas
        pairs = zip(got[a]["anchors"], got[b]["anchors"], strict=True)
        assert all(torch.equal(x, y) for x, y in pairs)
    assert got[0]["anchors"][0].shape == (8, 8) and got[1]["anchors"][0].shape == (7, 8)
