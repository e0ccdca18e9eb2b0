"""Per-step synchronisation statistics: bytes sent against uncompressed, and time in encode,
communication and decode.

Figures are recorded from the hook's thread and from the collectives' completion callbacks (which
run on the backend's threads), so :class:`SyncStats` serialises updates with a lock. A step opens
at its first bucket and closes when its last bucket has been submitted and every bucket of the
step has completed.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from typing import Any

from hipress.casync.logs import RANK_FILTER
from hipress.casync.trace import Tracer

__all__ = ["StepStats", "SyncStats"]

logger = logging.getLogger(__name__)
logger.addFilter(RANK_FILTER)


@dataclass(frozen=True)
class StepStats:
    """Figures of one synchronisation step on this rank.

    Fields:
        step: index of the step (0-based, counted by this state).
        buckets: buckets synchronised.
        collectives: collectives issued.
        bytes_sent: bytes this rank handed to collectives as input (allreduce: the uncompressed
            tensor; allgather: its block; all_to_all: all N blocks; PS gather phase: its block).
        bytes_uncompressed: bytes of the gradients, what DDP's allreduce hands to its collective.
        encode_ms: time spent encoding (workers and PS servers), with the NaN/Inf checks of
            compressed chunks that the encode does not do itself (a read pass each).
        decode_ms: time spent decoding, merging and averaging.
        codec_wait_ms: time encode and decode calls waited for each other (they run on the
            hook's and the backend's threads, one at a time); not part of the two above.
        comm_ms: summed time from issuing each collective to its completion (collectives
            overlap each other and encode/decode, so this can exceed ``sync_ms``).
        wait_ms: time the hook's thread blocked on collectives.
        sync_ms: wall time from the step's first bucket to its last completion.
    """

    step: int
    buckets: int = 0
    collectives: int = 0
    bytes_sent: int = 0
    bytes_uncompressed: int = 0
    encode_ms: float = 0.0
    decode_ms: float = 0.0
    codec_wait_ms: float = 0.0
    comm_ms: float = 0.0
    wait_ms: float = 0.0
    sync_ms: float = 0.0

    @property
    def ratio(self) -> float:
        """bytes_sent / bytes_uncompressed (1.0 when nothing was sent)."""
        return self.bytes_sent / self.bytes_uncompressed if self.bytes_uncompressed else 1.0

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ratio"] = self.ratio
        return d


_ADDITIVE = tuple(f.name for f in fields(StepStats) if f.name not in ("step", "sync_ms"))


class SyncStats:
    """Accumulates :class:`StepStats`; keeps the last ``history`` closed steps.

    Read ``last`` (the most recent closed step), ``steps`` (the kept history) or ``mean()``.
    Every ``log_every`` closed steps (0: never) a summary goes to the logger at INFO; every
    closed step goes at DEBUG.
    """

    def __init__(self, history: int = 1000, log_every: int = 100) -> None:
        if history < 1:
            raise ValueError(f"history must be >= 1, got {history}")
        if log_every < 0:
            raise ValueError(f"log_every must be >= 0, got {log_every}")
        self.log_every = log_every
        self.steps: deque[StepStats] = deque(maxlen=history)
        self._lock = threading.Lock()
        self._step = 0
        self._open: dict[str, float] | None = None
        self._t0 = 0.0
        self._outstanding = 0
        self._last_submitted = False
        self.tracer = Tracer()

    @property
    def last(self) -> StepStats | None:
        """The most recent closed step, or None before the first one closes."""
        return self.steps[-1] if self.steps else None

    def mean(self, last: int | None = None) -> dict[str, float]:
        """Mean of every figure over the kept steps, or over the ``last`` ones (empty if none)."""
        steps = list(self.steps)[-last:] if last else list(self.steps)
        if not steps:
            return {}
        keys = [*_ADDITIVE, "sync_ms", "ratio"]
        rows = [s.as_dict() for s in steps]
        return {k: sum(r[k] for r in rows) / len(rows) for k in keys}

    def bucket_submitted(self, last: bool) -> None:
        """Count a bucket handed to the engine; the first of a step opens the step."""
        with self._lock:
            if self._open is None or (self._last_submitted and self._outstanding == 0):
                self._open = dict.fromkeys(_ADDITIVE, 0.0)
                self._t0 = time.perf_counter()
                self._last_submitted = False
            self._open["buckets"] += 1
            self._outstanding += 1
            self._last_submitted = self._last_submitted or last

    def add(self, **figures: float) -> None:
        """Add to the open step's figures (names of :class:`StepStats` fields, times in
        seconds for ``*_ms`` fields)."""
        with self._lock:
            if self._open is None:
                return
            for k, v in figures.items():
                self._open[k] += v * 1e3 if k.endswith("_ms") else v

    @contextlib.contextmanager
    def timed(self, figure: str) -> Iterator[None]:
        """Add the wall time of the ``with`` block to ``figure`` (a ``*_ms`` field): a phase of
        the engine (encoding a round, decoding one), timed where it runs, and a span of
        :attr:`tracer` named after it (``encode``, ``decode``)."""
        phase = figure.removesuffix("_ms")
        t = time.perf_counter()
        try:
            with self.tracer.span(phase, phase):
                yield
        finally:
            self.add(**{figure: time.perf_counter() - t})

    def bucket_finished(self) -> None:
        """Count a completed bucket; closes the step when it was the last outstanding one."""
        with self._lock:
            self._outstanding -= 1
            if not (self._last_submitted and self._outstanding == 0 and self._open is not None):
                return
            figures = self._open
            closed = StepStats(
                step=self._step,
                sync_ms=(time.perf_counter() - self._t0) * 1e3,
                **{
                    k: int(v)
                    if k in ("buckets", "collectives", "bytes_sent", "bytes_uncompressed")
                    else v
                    for k, v in figures.items()
                },
            )
            self.steps.append(closed)
            self._step += 1
            self._open = None
            self._last_submitted = False
        logger.debug("casync step %s", closed.as_dict())
        if self.log_every and closed.step % self.log_every == 0:
            logger.info(
                "casync step %d: sent %.1f%% of %d bytes in %d collectives; encode %.2f ms, "
                "comm %.2f ms, decode %.2f ms, sync %.2f ms",
                closed.step,
                100.0 * closed.ratio,
                closed.bytes_uncompressed,
                closed.collectives,
                closed.encode_ms,
                closed.comm_ms,
                closed.decode_ms,
                closed.sync_ms,
            )

    def abandon_step(self) -> None:
        """Drop the open step (after a failed bucket), so the next bucket opens a new one."""
        with self._lock:
            self._open = None
            self._outstanding = 0
            self._last_submitted = False

    def __getstate__(self) -> dict[str, Any]:
        d = self.__dict__.copy()
        del d["_lock"]
        d.pop("tracer", None)
        return d

    def __setstate__(self, d: dict[str, Any]) -> None:
        self.__dict__.update(d)
        self._lock = threading.Lock()
        self.tracer = Tracer()
