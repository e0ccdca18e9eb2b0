"""SeCoPa's transport over Horovod: what ``plan="auto"`` profiles and broadcasts the plan with.

:class:`HorovodComm` implements :class:`~hipress.secopa.measure.comm.Comm` with Horovod's public
operations, the ones :class:`~hipress.horovod.sync.HorovodSync` trains with: ``allreduce_``
(``op=Sum``), ``allgather``/``allgather_async`` (a fresh output per call, as in training),
``alltoall`` (even splits), ``broadcast_``, ``allreduce(op=Max)`` for the timings, ``barrier``
and ``broadcast_object``. So the profile includes Horovod's own per-operation costs (its
background thread's negotiation and cycle time) that a ``torch.distributed`` profile would miss.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hipress.secopa.measure.comm import Wait
from hipress.secopa.model.profile import ProfileError

__all__ = ["HorovodComm"]


class HorovodComm:
    """:class:`~hipress.secopa.measure.comm.Comm` over all Horovod ranks (``hvd.init()`` done), with
    buffers on ``device`` (the gradients'; default CPU).

    Every operation carries a name (``hipress.secopa.<op>.<bytes>``): Horovod matches
    operations across ranks by name, and a name is reused only after its operation finished.
    Horovod's operations are blocking on the host (``synchronize`` waits for the device), so
    the profiler's timings hold on a GPU too.
    """

    point_to_point = False  # Horovod has no send/receive

    def __init__(self, hvd: Any, device: torch.device | str | None = None) -> None:
        self.hvd = hvd
        self.rank = int(hvd.rank())
        self.size = int(hvd.size())
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.backend = "horovod/gloo" if hvd.gloo_enabled() else "horovod/mpi"

    def barrier(self) -> None:
        self.hvd.barrier()

    def collective(self, op: str, nbytes: int) -> Callable[[], object]:
        hvd, name, dev = self.hvd, f"hipress.secopa.{op}.{nbytes}", self.device
        if op == "allreduce":
            t = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=dev)
            return lambda: hvd.allreduce_(t, op=hvd.Sum, name=name)
        if op == "all_gather":
            src = torch.ones(nbytes, dtype=torch.uint8, device=dev)
            return lambda: hvd.allgather(src, name=name)
        if op == "all_to_all":
            n = max(self.size, nbytes // self.size * self.size)
            src = torch.ones(n, dtype=torch.uint8, device=dev)
            return lambda: hvd.alltoall(src, name=name)
        if op == "broadcast":
            t = torch.ones(nbytes, dtype=torch.uint8, device=dev)
            return lambda: hvd.broadcast_(t, root_rank=0, name=name)
        raise ProfileError(f"unknown collective {op!r}")

    def start_all_gather(self, nbytes: int) -> Callable[[], Wait]:
        hvd, name = self.hvd, f"hipress.secopa.all_gather_async.{nbytes}"
        src = torch.ones(nbytes, dtype=torch.uint8, device=self.device)

        def start() -> Wait:
            handle = hvd.allgather_async(src, name=name)
            return lambda: hvd.synchronize(handle)

        return start

    def all_reduce(self, values: torch.Tensor, op: str = "sum") -> torch.Tensor:
        ops = {"sum": self.hvd.Sum, "max": self.hvd.Max}
        if op not in ops:
            raise ProfileError(f"unknown reduction {op!r} (sum, max)")
        return self.hvd.allreduce(values, op=ops[op], name=f"hipress.secopa.reduce_{op}")

    def broadcast_object(self, obj: Any) -> Any:
        return self.hvd.broadcast_object(obj, root_rank=0, name="hipress.secopa.object")
