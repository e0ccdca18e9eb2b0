"""Metrics for a user's logger: flat ``{name: float}`` snapshots with stable names.

Every sync that compresses gradients reports through the same names (:data:`METRICS`), so a
dashboard made for one works for the others:

- :meth:`hipress.casync.CaSyncState.metrics` -- the DDP hook's figures of its latest steps;
- :meth:`hipress.fsdp.FsdpCompression.metrics` -- FSDP2's counters since registration;
- the Lightning and Hugging Face callbacks log them through the framework's own logging, and
  :func:`hipress.integrations.accelerate.log_metrics` hands them to Accelerate's trackers.

A snapshot holds only the names its source measures (FSDP2 has no timings), every value a
plain ``float``. :func:`write_scalars` writes one to a TensorBoard ``SummaryWriter`` (or any
object with its ``add_scalar(tag, value, global_step)``), so TensorBoard is not a dependency.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from hipress.codec.errors import CaSyncError

__all__ = ["METRICS", "PREFIX", "ScalarWriter", "write_scalars"]

PREFIX = "hipress/"

# name -> what it measures (the table in docs/reference/metrics.md says the same)
METRICS: Mapping[str, str] = {
    "hipress/step": "index of the latest synchronisation step the figures are from",
    "hipress/bytes_ratio": "bytes sent / bytes an uncompressed sync sends (1.0: no saving)",
    "hipress/bytes_sent": "bytes this rank handed to collectives (per step; FSDP: in total)",
    "hipress/bytes_uncompressed": "bytes of the gradients (per step; FSDP: in total)",
    "hipress/encode_ms": "time encoding, per step",
    "hipress/decode_ms": "time decoding and averaging, per step",
    "hipress/wait_ms": "time the training thread blocked on collectives, per step",
    "hipress/comm_ms": "summed time of the collectives, per step (they overlap)",
    "hipress/sync_ms": "wall time from a step's first bucket to its last completion",
    "hipress/compressed_tensors": "tensors (FSDP: units) the plan compresses",
    "hipress/tensors": "tensors (FSDP: units) synchronised",
    "hipress/reduce_scatters": "FSDP2 reduce-scatters run (compressed or not)",
}


class ScalarWriter(Protocol):
    """What :func:`write_scalars` needs of a writer: ``torch.utils.tensorboard.SummaryWriter``'s
    ``add_scalar``."""

    def add_scalar(self, tag: str, scalar_value: float, global_step: int | None = None) -> Any:
        ...


def write_scalars(
    writer: ScalarWriter, metrics: Mapping[str, float], step: int | None = None
) -> None:
    """Write every entry of ``metrics`` (a snapshot) as a scalar at ``global_step=step``.

    Raises :class:`~hipress.codec.errors.CaSyncError` if ``writer`` has no ``add_scalar``.
    """
    add = getattr(writer, "add_scalar", None)
    if not callable(add):
        raise CaSyncError(
            f"write_scalars needs a writer with add_scalar(tag, value, global_step) such as "
            f"torch.utils.tensorboard.SummaryWriter, got a {type(writer).__name__}"
        )
    for name, value in metrics.items():
        add(name, float(value), global_step=step)
