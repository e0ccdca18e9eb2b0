"""Execution of one bucket's schedule, one module per strategy.

:mod:`~hipress.casync.strategies.op` holds :class:`BucketOp`, the lifecycle every strategy
shares (issue order, completion, failure, draining); :mod:`~.allreduce` (uncompressed),
:mod:`~.allgather`, :mod:`~.ps` and :mod:`~.ring` (compressed) each run their part of a bucket
through its public surface; :mod:`~.context` holds what every operation of a state shares.
"""

from __future__ import annotations

from hipress.casync.strategies.context import SyncContext, all_gather
from hipress.casync.strategies.op import BucketOp, RoundIO
from hipress.casync.strategies.ring import RingDriver

__all__ = ["BucketOp", "RingDriver", "RoundIO", "SyncContext", "all_gather"]
