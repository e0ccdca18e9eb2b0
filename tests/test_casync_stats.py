"""Per-step statistics (hipress.casync.stats)."""

from __future__ import annotations

import logging
import pickle

import pytest

from hipress.casync.stats import SyncStats


def test_a_step_closes_when_its_last_bucket_completes(caplog: pytest.LogCaptureFixture) -> None:
    stats = SyncStats(log_every=1)
    stats.bucket_submitted(last=False)
    stats.add(bytes_sent=100, bytes_uncompressed=400, encode_ms=0.002, collectives=2)
    stats.bucket_submitted(last=True)
    stats.add(bytes_sent=50, bytes_uncompressed=200, decode_ms=0.001, collectives=1)
    stats.bucket_finished()
    assert stats.last is None  # one bucket still outstanding
    with caplog.at_level(logging.INFO, logger="hipress.casync.stats"):
        stats.bucket_finished()
    last = stats.last
    assert last is not None and last.step == 0 and last.buckets == 2
    assert (last.bytes_sent, last.bytes_uncompressed, last.collectives) == (150, 600, 3)
    assert last.ratio == pytest.approx(0.25)
    assert last.encode_ms == pytest.approx(2.0) and last.decode_ms == pytest.approx(1.0)
    assert "sent 25.0% of 600 bytes" in caplog.text

    stats.bucket_submitted(last=True)
    stats.bucket_finished()
    assert stats.last.step == 1 and len(stats.steps) == 2
    assert stats.mean()["bytes_sent"] == pytest.approx(75)
    assert stats.mean(last=1)["bytes_sent"] == 0


def test_abandoned_steps_are_dropped_and_stats_pickle() -> None:
    stats = SyncStats(history=2, log_every=0)
    stats.bucket_submitted(last=True)
    stats.abandon_step()
    assert stats.last is None
    for _ in range(3):
        stats.bucket_submitted(last=True)
        stats.bucket_finished()
    assert [s.step for s in stats.steps] == [1, 2]
    clone = pickle.loads(pickle.dumps(stats))
    assert clone.last == stats.last
    clone.bucket_submitted(last=True)  # its lock was recreated
    clone.bucket_finished()
    assert clone.last.step == 3


def _resumed_counts(rank: int, world_size: int, warmup: int) -> tuple[list[int], list[int]]:
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from hipress.casync import register

    def run(steps: int, sd: dict | None) -> tuple[list[int], dict]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(256, 300), nn.ReLU(), nn.Linear(300, 4))
        ddp = DDP(model)
        state = register(ddp, "onebit", warmup_steps=warmup, log_every=0)
        if sd is not None:
            state.load_state_dict(sd)
        gen = torch.Generator().manual_seed(rank)
        for _ in range(steps):
            ddp(torch.randn(8, 256, generator=gen)).square().mean().backward()
        return [s.step for s in state.stats.steps], state.state_dict()

    before, sd = run(3, None)
    after, _ = run(2, sd)
    return before, after


@pytest.mark.parametrize("warmup", [0, 1])
def test_the_step_counter_continues_after_a_checkpoint_resume(warmup: int) -> None:
    from dist_utils import run_workers

    for before, after in run_workers(_resumed_counts, 2, warmup):
        assert before == [0, 1, 2]  # warm-up steps are counted too
        assert after == [3, 4]
