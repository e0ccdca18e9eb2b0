"""What every bucket operation of one CaSync state shares (:class:`SyncContext`), and the
all-gather collective under its current name.

A backend thread drops its reference to a work only after the work completes; if that is the
last one, the work (its tensors, its thread-local state) is released on that thread, which must
take the GIL, and during interpreter shutdown a thread that takes the GIL is stopped
mid-destructor (std::terminate: SIGABRT, the exit status lost). This happens to any finished
collective, CaSync's or not (a barrier, an all-reduce), when the process ends right after it.
So works of failed operations are kept for the life of the process (:data:`RETIRED`), and a
process that made a :class:`SyncContext` waits a moment at exit
(:func:`hipress.core.release.settle_at_exit`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from hipress.casync.stats import SyncStats
from hipress.casync.strategies.driver import RingDriver
from hipress.codec.errors import CaSyncError
from hipress.core.compression import CompressionAlgorithm
from hipress.core.release import settle_at_exit

__all__ = ["RETIRED", "SyncContext", "all_gather"]

RETIRED: list[Any] = []

# torch 2.13 renamed all_gather_into_tensor (and deprecated the old name)
all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclass
class SyncContext:
    """What every bucket operation of one CaSync state shares.

    It holds no process group: completion callbacks reach this object, and the last
    reference to a process group must never drop on the backend's own thread (its destructor
    would join that thread). The group is passed to each operation's ``start`` and ``advance``
    instead (:class:`~hipress.casync.strategies.op.BucketOp`).

    Fields:
        rank, world_size: this rank and N in the process group.
        algorithm: the compression algorithm (``Uncompressed`` if nothing is compressed).
        worker_states, server_states: per-chunk states, see ``init_chunk_states``.
        stats: where figures are recorded.
        check_finite: whether to look for NaN/Inf in the input (one extra pass over the bucket).
        device_flags: keep non-finite flags on the device (None: for CUDA buffers; tests set it
            True to run that path on a CPU).
        codec_lock: serialises the algorithm's encode and decode calls, which run on the
            hook's thread, on the backend's completion threads and on the ring driver's thread:
            an algorithm object need not be thread-safe.
        ring: the thread that runs ring rounds (started at the first one).
    """

    rank: int
    world_size: int
    algorithm: CompressionAlgorithm
    worker_states: Mapping[str, Any]
    server_states: Mapping[str, Any]
    stats: SyncStats
    check_finite: bool = True
    device_flags: bool | None = None
    codec_lock: threading.Lock = field(default_factory=threading.Lock)
    ring: RingDriver = field(default_factory=RingDriver)

    def __post_init__(self) -> None:
        settle_at_exit()

    def decode_into(
        self, region: torch.Tensor, scratch: torch.Tensor, decode: Callable[..., None], *args: Any
    ) -> None:
        """Run ``decode(*args, out=out)`` under the codec lock so that ``region`` ends up
        holding what it writes: ``out`` is ``region`` itself where it is float32, else the
        float32 ``scratch`` (at least ``region``'s size), copied (cast) into ``region`` after."""
        out = region if region.dtype == torch.float32 else scratch[: region.numel()]
        with self.codec("decode_ms"):
            decode(*args, out=out)
        if out is not region:
            region.copy_(out)

    @contextlib.contextmanager
    def codec(self, figure: str) -> Iterator[None]:
        """Hold :attr:`codec_lock` around one encode or decode call. The caller times the whole
        stage as ``figure`` (``encode_ms`` or ``decode_ms``); the time spent waiting here for
        the lock (another thread's call) is counted as ``codec_wait_ms`` and, on the host's
        clock, taken out of the figure, so the two figures are compute, not turns at the lock
        (a stream-ordered figure holds a host wait only where the stream ran dry meanwhile)."""
        t = time.perf_counter()
        with self.codec_lock:
            waited = time.perf_counter() - t
            if self.stats.clock.on_host:
                self.stats.add(codec_wait_ms=waited, **{figure: -waited})
            else:  # the figure is the streams' time, which the host's wait is not part of
                self.stats.add(codec_wait_ms=waited)
            if waited > 2e-5:
                self.stats.tracer.span_event("codec lock", "lock", t, waited)
            try:
                yield
            except CaSyncError:
                raise
            except Exception as exc:  # this rank's own failure, not the network's
                what = "encoding" if figure == "encode_ms" else "decoding"
                raise CaSyncError(
                    f"CaSync: {what} failed on this rank ({type(exc).__name__}: {exc})"
                ) from exc
