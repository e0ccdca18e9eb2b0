"""Execution of one bucket's schedule, one module per strategy.

:mod:`~hipress.casync.strategies.op` holds :class:`BucketOp`, the lifecycle every strategy
shares (issue order, completion, failure, draining); :mod:`~.allreduce` (uncompressed),
:mod:`~.allgather`, :mod:`~.ps` and :mod:`~.ring` (compressed) each run their part of a bucket
through its public surface (:mod:`~.surface`, which they import instead of the operation's
module); :mod:`~.context` holds what every operation of a state shares, :mod:`~.driver` the
thread that runs ring rounds.
"""

from __future__ import annotations

from hipress.casync.strategies.context import SyncContext, all_gather
from hipress.casync.strategies.driver import RingDriver
from hipress.casync.strategies.op import BucketOp
from hipress.casync.strategies.surface import Operation, RoundIO

__all__ = ["BucketOp", "Operation", "RingDriver", "RoundIO", "SyncContext", "all_gather"]
