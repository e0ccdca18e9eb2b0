"""The DDP hook's metrics: :meth:`SyncMetrics.metrics`, a flat snapshot for a user's logger.

:class:`~hipress.casync.CaSyncState` takes :meth:`~SyncMetrics.metrics` from
:class:`SyncMetrics`. The names are :data:`hipress.codec.metrics.METRICS`' (``hipress/...``);
:func:`hipress.codec.metrics.write_scalars` writes a snapshot to TensorBoard.
"""

from __future__ import annotations

from typing import Any

from hipress.casync.stats import StepStats

__all__ = ["SyncMetrics", "step_metrics"]

# StepStats figures averaged per step, under their metric names
_MEAN = {
    "bytes_sent": "hipress/bytes_sent",
    "bytes_uncompressed": "hipress/bytes_uncompressed",
    "encode_ms": "hipress/encode_ms",
    "decode_ms": "hipress/decode_ms",
    "wait_ms": "hipress/wait_ms",
    "comm_ms": "hipress/comm_ms",
    "sync_ms": "hipress/sync_ms",
}


def step_metrics(steps: list[StepStats]) -> dict[str, float]:
    """The snapshot of ``steps`` (at least one, oldest first): the latest step's index, the
    bytes ratio over all of them, and the per-step means of the other figures."""
    sent = sum(s.bytes_sent for s in steps)
    raw = sum(s.bytes_uncompressed for s in steps)
    out = {
        "hipress/step": float(steps[-1].step),
        "hipress/bytes_ratio": sent / raw if raw else 1.0,
    }
    for field, name in _MEAN.items():
        out[name] = float(sum(getattr(s, field) for s in steps)) / len(steps)
    return out


class SyncMetrics:
    """What gives :class:`~hipress.casync.CaSyncState` its :meth:`metrics` (it needs the
    state's ``stats``, a :class:`~hipress.casync.SyncStats`, and its runtime ``_rt``)."""

    stats: Any
    _rt: Any

    def metrics(self, steps: int = 1) -> dict[str, float]:
        """This rank's figures as ``{name: float}`` with :data:`hipress.codec.metrics.METRICS`'
        names: ``hipress/step``, ``hipress/bytes_ratio``, the per-step means of
        ``hipress/bytes_sent``, ``hipress/bytes_uncompressed``, ``hipress/encode_ms``,
        ``hipress/decode_ms``, ``hipress/wait_ms``, ``hipress/comm_ms`` and ``hipress/sync_ms``
        over the last ``steps`` synchronisation steps whose figures are read, and, once the
        plan is made, ``hipress/compressed_tensors`` and ``hipress/tensors``.

        Never waits and never communicates: on a GPU a step's figures are read once the device
        has done its work, so the latest figures may be a step behind; before the first step
        only the plan's counts (or nothing, with ``plan="auto"``) are there.
        """
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        recent = self.stats.recent(steps)
        out = step_metrics(recent) if recent else {}
        rt = self._rt
        if rt is not None:
            out["hipress/compressed_tensors"] = float(sum(e.compress for e in rt.plan.entries))
            out["hipress/tensors"] = float(len(rt.plan.entries))
        return out
