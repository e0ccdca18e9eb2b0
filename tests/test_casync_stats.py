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
