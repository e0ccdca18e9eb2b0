"""CaSync: compression-aware gradient synchronisation on ``torch.distributed``.

A DDP communication hook that synchronises each parameter's gradient as a plan says: uncompressed
allreduce (small tensors batched), compressed allgather, or compressed PS (scatter-reduce +
all-gather with a server co-located on every worker), with partitions pipelined and the payloads
of many tensors batched into one collective. See docs/explanation/casync.md.

    state = hipress.casync.register(ddp_model, algorithm="terngrad", params={"bitwidth": 2})
"""

from __future__ import annotations

from hipress.casync.hook import CaSyncState, casync_hook, register
from hipress.casync.stats import StepStats, SyncStats
from hipress.codec.errors import CaSyncError, CommError, ConfigMismatchError
from hipress.core.rule import DefaultRule

__all__ = [
    "CaSyncError",
    "CaSyncState",
    "CommError",
    "ConfigMismatchError",
    "DefaultRule",
    "StepStats",
    "SyncStats",
    "casync_hook",
    "register",
]
