"""The metrics snapshot (hipress.casync.metrics, hipress.codec.metrics): names, figures, and the
TensorBoard writer. The figures of real runs are checked where the frameworks log them
(tests/test_integrations_accelerate.py, _lightning.py, _transformers.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from hipress.casync import CaSyncError, StepStats
from hipress.casync.metrics import step_metrics
from hipress.codec.metrics import METRICS, write_scalars

HAVE_TENSORBOARD = importlib.util.find_spec("tensorboard") is not None


def test_step_metrics_are_flat_floats_with_documented_names() -> None:
    steps = [
        StepStats(step=4, bytes_sent=10, bytes_uncompressed=100, encode_ms=1.0, sync_ms=3.0),
        StepStats(step=5, bytes_sent=30, bytes_uncompressed=100, encode_ms=3.0, sync_ms=5.0),
    ]
    m = step_metrics(steps)
    assert set(m) <= set(METRICS)
    assert all(type(v) is float for v in m.values())
    assert m["hipress/step"] == 5.0
    assert m["hipress/bytes_ratio"] == pytest.approx(0.2)  # over both steps' bytes
    assert m["hipress/encode_ms"] == 2.0 and m["hipress/sync_ms"] == 4.0
    assert m["hipress/bytes_sent"] == 20.0


def test_metric_names_are_in_the_reference() -> None:
    page = (Path(__file__).parent.parent / "docs/reference/metrics.md").read_text()
    missing = [name for name in METRICS if f"`{name}`" not in page]
    assert not missing, f"docs/reference/metrics.md lacks {missing}"


class _Writer:
    """A writer with SummaryWriter's add_scalar (TensorBoard is not installed here)."""

    def __init__(self) -> None:
        self.scalars: list[tuple[str, float, Any]] = []

    def add_scalar(self, tag: str, scalar_value: float, global_step: int | None = None) -> None:
        self.scalars.append((tag, scalar_value, global_step))


def test_write_scalars_writes_every_metric_at_the_step(tmp_path: Path) -> None:
    metrics = {"hipress/bytes_ratio": 0.03, "hipress/encode_ms": 1.5}
    if HAVE_TENSORBOARD:  # the real writer, read back from its event file
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        from torch.utils.tensorboard import SummaryWriter

        with SummaryWriter(tmp_path) as writer:
            write_scalars(writer, metrics, step=7)
        acc = EventAccumulator(str(tmp_path))
        acc.Reload()
        got = {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}
        assert got == {k: [(7, pytest.approx(v))] for k, v in metrics.items()}
        return
    writer = _Writer()
    write_scalars(writer, metrics, step=7)
    assert writer.scalars == [("hipress/bytes_ratio", 0.03, 7), ("hipress/encode_ms", 1.5, 7)]


def test_write_scalars_refuses_a_writer_without_add_scalar() -> None:
    with pytest.raises(CaSyncError, match=r"add_scalar.*got a dict"):
        write_scalars({}, {"hipress/step": 1.0})  # type: ignore[arg-type]
