"""FSDP2's metrics: :func:`snapshot` (also ``comp.metrics()``), the flat ``{name: float}`` of
:data:`hipress.codec.metrics.METRICS`' names for a user's logger."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from hipress.fsdp.collective import UnitStats

__all__ = ["snapshot"]


def snapshot(comp: Any) -> dict[str, float]:
    """``comp``'s (a :class:`~hipress.fsdp.FsdpCompression`) counters on this rank since :func:`~hipress.fsdp.register`, summed over its
    units: ``hipress/bytes_ratio``, ``hipress/bytes_sent``, ``hipress/bytes_uncompressed``,
    ``hipress/reduce_scatters``, ``hipress/compressed_tensors`` (units compressed) and
    ``hipress/tensors`` (units). No collective; the replica all-reduces are not counted."""
    total = asdict(UnitStats())
    for unit in comp.units.values():
        for key, value in asdict(unit.stats).items():
            total[key] += value
    raw = total["raw_bytes"]
    return {
        "hipress/bytes_ratio": total["sent_bytes"] / raw if raw else 1.0,
        "hipress/bytes_sent": float(total["sent_bytes"]),
        "hipress/bytes_uncompressed": float(raw),
        "hipress/reduce_scatters": float(total["calls"]),
        "hipress/compressed_tensors": float(sum(u.compress for u in comp.units.values())),
        "hipress/tensors": float(len(comp.units)),
    }
