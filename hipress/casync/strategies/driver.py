"""The thread that runs ring rounds: :class:`RingDriver`.

The hops of a ring round depend on each other, so issuing them from the hook would stall
backward: they run on a daemon thread of their own, one job after another in submission order
(:mod:`hipress.casync.strategies.ring` says what a job does). On CUDA buffers the thread sets
the buffer's device and works on a stream of its own that first waits for the hook's stream
(the bucket is ready). The thread ends with the driver (:meth:`RingDriver.close`).
"""

from __future__ import annotations

import queue
import threading
from typing import Protocol

import torch
import torch.distributed as dist

from hipress.codec.errors import CaSyncError

__all__ = ["RingDriver", "RingJob"]


class RingJob(Protocol):
    """What the driver needs of an operation whose rounds it runs."""

    buffer: torch.Tensor

    def run_ring(self, rounds: list[int], group: dist.ProcessGroup | None) -> None:
        """Run the ring rounds ``rounds`` (indices into the schedule) over ``group``."""
        ...

    def fail(self, exc: BaseException, what: str = ...) -> CaSyncError:
        """Fail the operation with ``exc``; return the error."""
        ...


_Entry = tuple[RingJob, list[int], "dist.ProcessGroup | None", "torch.cuda.Event | None"]


class RingDriver:
    """A daemon thread running the ring rounds of bucket operations, in submission order.

    Every rank submits the same operations in the same order (the hook's bucket order), so the
    k-th message rank r sends to r+1 is the k-th one r+1 expects. After a failure every later
    operation fails at once with the same error instead of waiting out the timeout again.
    :meth:`close` ends the thread (idempotent; the owner calls it when it is collected).
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[_Entry | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._broken: CaSyncError | None = None
        self._closed = False

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(self, op: RingJob, rounds: list[int], group: dist.ProcessGroup | None) -> None:
        """Run ``op``'s ring rounds (indices into its schedule) on the driver thread; if that
        raises, fail ``op`` and every later operation."""
        if self._closed:
            raise CaSyncError("the CaSync state's ring thread was closed")
        ready = None
        if op.buffer.is_cuda:  # the bucket is complete on the hook's current stream
            ready = torch.cuda.current_stream(op.buffer.device).record_event()
        with self._start_lock:
            if self._closed:
                raise CaSyncError("the CaSync state's ring thread was closed")
            if self._thread is None:
                self._thread = threading.Thread(
                    target=_drive, args=(self._queue, self), name="hipress-casync-ring",
                    daemon=True,
                )  # fmt: skip
                self._thread.start()
        self._queue.put((op, rounds, group, ready))

    def close(self) -> None:
        """End the thread once the rounds queued before are done."""
        with self._start_lock:
            if self._closed:
                return
            self._closed = True
            if self._thread is not None:
                self._queue.put(None)

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)


def _drive(jobs: queue.SimpleQueue[_Entry | None], driver: RingDriver) -> None:
    streams: dict[torch.device, torch.cuda.Stream] = {}
    while True:
        job = jobs.get()
        if job is None:
            return
        op, rounds, group, ready = job
        if driver._broken is not None:
            op.fail(driver._broken, "ring")
        else:
            try:
                if ready is None:
                    op.run_ring(rounds, group)
                else:
                    dev = op.buffer.device
                    torch.cuda.set_device(dev)
                    stream = streams.setdefault(dev, torch.cuda.Stream(dev))
                    with torch.cuda.stream(stream):
                        stream.wait_event(ready)
                        op.run_ring(rounds, group)
            except BaseException as exc:
                driver._broken = op.fail(exc, "ring transfer")
        # hold nothing while idle: the op's buffers and the group belong to the hook
        del op, rounds, group, ready, job
