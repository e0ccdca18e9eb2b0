"""The compression layer every sync shares: the DDP hook (:mod:`hipress.casync`),
:mod:`hipress.fsdp` and :mod:`hipress.horovod` build on it and never on each other.

- :mod:`~hipress.codec.algorithm` -- an algorithm from a name or an object, its kernels built
  ahead, encode with the NaN/Inf report, the mean of N decodes, the per-chunk states and their
  random streams.
- :mod:`~hipress.codec.flags` -- non-finite flags, on the host or on the device.
- :mod:`~hipress.codec.checkpoint` -- the per-rank and gathered state-dict formats.
- :mod:`~hipress.codec.integrity` -- a checkpoint's digest, and the check that its states are
  finite.
- :mod:`~hipress.codec.residual` -- each algorithm's not-yet-sent mass, read out of a state and
  written into another (resharding).
- :mod:`~hipress.codec.errors` -- the exceptions, and the base every integration's derive from.
- :mod:`~hipress.codec.planning` -- which plan runs: given, from a file, ``"auto"`` or the
  default rule (:class:`~hipress.core.rule.DefaultRule`).
- :mod:`~hipress.codec.logs` -- log lines that name their rank.
- :mod:`~hipress.codec.outcome` -- every rank raises together when a step fails on one rank.

It sits above SeCoPa (``plan="auto"`` asks its planner) and below every integration.
"""

from __future__ import annotations

from hipress.codec.errors import CaSyncError, CommError, ConfigMismatchError

__all__ = ["CaSyncError", "CommError", "ConfigMismatchError"]
