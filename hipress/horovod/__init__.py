"""Compressed gradient synchronisation over Horovod: a drop-in for ``hvd.DistributedOptimizer``.

    import horovod.torch as hvd
    import hipress.horovod

    hvd.init()
    opt = hipress.horovod.DistributedOptimizer(
        opt, named_parameters=model.named_parameters(), algorithm="terngrad",
        params={"bitwidth": 2})

Plans, per-chunk algorithm states and their random streams are CaSync's; only the transport
(Horovod's public async operations) and the triggering (per-parameter gradient hooks, like
Horovod's own optimizer) differ. Importing this package does not import Horovod; calling
:func:`DistributedOptimizer` without it raises :class:`HorovodNotInstalledError` with an install
hint. See docs/reference/horovod-api.md.
"""

from __future__ import annotations

from hipress.codec.errors import ConfigMismatchError
from hipress.horovod.errors import HorovodNotInstalledError, HorovodSyncError
from hipress.horovod.optimizer import DistributedOptimizer
from hipress.horovod.sync import HorovodSync

__all__ = [
    "ConfigMismatchError",
    "DistributedOptimizer",
    "HorovodNotInstalledError",
    "HorovodSync",
    "HorovodSyncError",
]
