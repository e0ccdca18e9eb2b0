"""The transport the profiler and the plan broadcast run over.

SeCoPa's online profile (:func:`~hipress.secopa.measure.netprofiler.measure_network`,
:func:`~hipress.secopa.measure.netprofiler.measure_overlap`) and the plan broadcast
(:func:`~hipress.secopa.measure.runtime.broadcast_plan`) need only a few collective calls; :class:`Comm`
names them, so the same measurement runs over ``torch.distributed`` (:class:`TorchComm`, the
default everywhere) or over Horovod (``hipress.horovod.comm.HorovodComm``). A ``Comm`` measures
the collectives the way its training path issues them, so the profile describes that path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.distributed as dist

from hipress.core.torchcompat import reduce_scatter_single
from hipress.secopa.model.profile import ProfileError

__all__ = ["Comm", "TorchComm", "Wait", "default_device"]

Wait = Callable[[], object]


class Comm(Protocol):
    """Collectives over a fixed set of ranks; every rank makes the same calls in the same order.

    Attributes:
        rank: this rank's index in the set (0 .. size-1); rank 0 plans.
        size: number of ranks.
        backend: a short name recorded in the profile's provenance (``gloo``, ``horovod/gloo``).
        point_to_point: whether :meth:`collective` also offers ``send`` (a ring exchange:
            every rank sends to the next and receives from the previous at once, one hop of
            CaSync's ring).
    """

    rank: int
    size: int
    backend: str
    point_to_point: bool

    def barrier(self) -> None:
        """Return once every rank has called it."""
        ...

    def collective(self, op: str, nbytes: int) -> Callable[[], object]:
        """A zero-argument blocking call of collective ``op`` (``allreduce``, ``all_gather``,
        ``all_to_all``, ``broadcast``, and ``send`` if :attr:`point_to_point`) with ``nbytes``
        per rank; its buffers are allocated once, here. ``all_to_all`` gets a size divisible by
        :attr:`size`."""
        ...

    def start_all_gather(self, nbytes: int) -> Callable[[], Wait]:
        """A zero-argument call that starts an all-gather of ``nbytes`` per rank without
        waiting and returns a zero-argument call that waits for it."""
        ...

    def all_reduce(self, values: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Elementwise ``sum`` or ``max`` of a float64 vector over all ranks (a new tensor)."""
        ...

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's picklable ``obj`` on every rank (others pass anything, e.g. None)."""
        ...


def _all_gather(dst: torch.Tensor, src: torch.Tensor, group: Any, async_op: bool = False) -> Any:
    # all_gather_single replaces the deprecated all_gather_into_tensor in recent torch.
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(dst, src, group=group, async_op=async_op)


def default_device(group: Any = None) -> torch.device:
    """The device a process group's collectives run on: CUDA (the current device) for an
    NCCL-only group, else the CPU. A group that serves both (``cpu:gloo,cuda:nccl``) is
    measured on the device the model trains on: pass that instead."""
    backend = str(dist.get_backend(group)).lower()
    if "nccl" in backend and "gloo" not in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _as_casync(issue: Callable[[], Any], device: torch.device) -> Callable[[], object]:
    """A blocking call of an asynchronous collective completed the way CaSync completes its
    own: a callback on the work's future (run on the backend's thread) completes a second
    future, which the caller waits for. On loopback that hand-off costs about 0.15 ms per
    collective more than a plain blocking call, which the profile should see.
    On a GPU the work's future completes once the collective is enqueued: the call then makes
    the current stream wait for the work (timed with CUDA events, :mod:`netprofiler`)."""
    if device.type == "cuda":
        return lambda: issue().wait()

    def call() -> object:
        done: torch.futures.Future[None] = torch.futures.Future()

        def finish(fut: torch.futures.Future[Any]) -> None:
            try:
                fut.value()
                done.set_result(None)
            except BaseException as exc:  # surfaces in done.wait() below
                done.set_exception(exc)

        issue().get_future().add_done_callback(finish)
        return done.wait()

    return call


class TorchComm:
    """:class:`Comm` over a ``torch.distributed`` process group (default: the default group),
    on ``device`` (default: :func:`default_device`; the model's device for a group that serves
    several).

    Needs an initialised process group. Buffers are preallocated and reused, and collectives
    are issued asynchronously and completed through a callback, as CaSync does (on a GPU: a
    wait of the current stream, see :func:`_as_casync`).
    """

    point_to_point = True

    def __init__(self, group: Any = None, device: torch.device | str | None = None) -> None:
        if not dist.is_initialized():
            raise ProfileError("TorchComm needs an initialised torch.distributed process group")
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.device = torch.device(device) if device is not None else default_device(group)
        self.backend = str(dist.get_backend(group)) + (
            "" if self.device.type == "cpu" else f"/{self.device.type}"
        )
        self._src = dist.get_global_rank(group, 0) if group is not None else 0

    def barrier(self) -> None:
        dist.barrier(group=self.group)

    def collective(self, op: str, nbytes: int) -> Callable[[], object]:
        group, world, dev = self.group, self.size, self.device

        def u8(n: int, fill: bool = False) -> torch.Tensor:
            return (torch.ones if fill else torch.empty)(n, dtype=torch.uint8, device=dev)

        if op == "allreduce":
            t = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=dev)
            return _as_casync(lambda: dist.all_reduce(t, group=group, async_op=True), dev)
        if op == "all_gather":
            src, dst = u8(nbytes, True), u8(nbytes * world)
            return _as_casync(lambda: _all_gather(dst, src, group, async_op=True), dev)
        if op == "all_to_all":
            n = max(world, nbytes // world * world)
            src, dst = u8(n, True), u8(n)
            return _as_casync(
                lambda: dist.all_to_all_single(dst, src, group=group, async_op=True), dev
            )
        if op == "reduce_scatter":  # FSDP2's gradient reduction: float32, N rows in, one out
            rows = max(world, nbytes // 4 // world * world)
            src = torch.ones(rows, dtype=torch.float32, device=dev)
            dst = torch.empty(rows // world, dtype=torch.float32, device=dev)

            def reduce_scatter() -> None:  # as FSDP2 issues it (gloo's work has no future)
                reduce_scatter_single(dst, src, group=group)

            return reduce_scatter
        if op == "broadcast":
            t = u8(nbytes, True)
            return _as_casync(
                lambda: dist.broadcast(t, src=self._src, group=group, async_op=True), dev
            )
        if op == "send":  # one ring hop, as CaSync's ring sends it
            out, into = u8(nbytes, True), u8(nbytes)
            right, left = (self.rank + 1) % world, (self.rank - 1) % world

            def hop() -> None:
                for w in dist.batch_isend_irecv([
                    dist.P2POp(dist.isend, out, group=group, group_peer=right),
                    dist.P2POp(dist.irecv, into, group=group, group_peer=left),
                ]):  # fmt: skip
                    w.wait()

            return hop
        raise ProfileError(f"unknown collective {op!r}")

    def start_all_gather(self, nbytes: int) -> Callable[[], Wait]:
        src = torch.ones(nbytes, dtype=torch.uint8, device=self.device)
        dst = torch.empty(nbytes * self.size, dtype=torch.uint8, device=self.device)

        def start() -> Wait:
            work = _all_gather(dst, src, self.group, async_op=True)
            return work.wait if work is not None else (lambda: None)

        return start

    def all_reduce(self, values: torch.Tensor, op: str = "sum") -> torch.Tensor:
        ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}
        if op not in ops:
            raise ProfileError(f"unknown reduction {op!r} (sum, max)")
        out = values.to(self.device, copy=True)
        dist.all_reduce(out, op=ops[op], group=self.group)
        return out.to(values.device)

    def broadcast_object(self, obj: Any) -> Any:
        box = [obj if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=self._src, group=self.group)
        return box[0]
