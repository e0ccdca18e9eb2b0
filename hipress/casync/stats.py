"""Per-step synchronisation statistics: bytes sent against uncompressed, and time in encode,
communication and decode.

Figures are recorded from the hook's thread and from the collectives' completion callbacks (which
run on the backend's threads), so :class:`SyncStats` serialises updates with a lock. A step opens
at its first bucket and closes when its last bucket has been submitted and every bucket of the
step has completed.

Times come from the step's :class:`~hipress.casync.clock.Clock`, chosen by the buckets' device:
on a CPU the wall clock, read at once; on a GPU events in the streams' order, whose figures are
read once the device has done the work. Such a step waits, closed, until then: at the next
step's start whatever has completed is read, and reading :attr:`SyncStats.steps`,
:attr:`~SyncStats.last` or :meth:`~SyncStats.mean` waits for the rest (never inside the hook).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch

from hipress.casync.clock import Clock, HostMark, Lap, Mark, clock_for
from hipress.casync.trace import DEVICE_LANE, Tracer
from hipress.codec.logs import RANK_FILTER

__all__ = ["StepStats", "SyncStats"]

logger = logging.getLogger(__name__)
logger.addFilter(RANK_FILTER)


@dataclass(frozen=True)
class StepStats:
    """Figures of one synchronisation step on this rank.

    Fields:
        step: index of the step (0-based, counted by this state, warm-up steps included; a
            state restored from a checkpoint counts on from the checkpoint's step).
        buckets: buckets synchronised.
        collectives: collectives issued.
        bytes_sent: bytes this rank handed to collectives as input (allreduce: the uncompressed
            tensor; allgather: its block; all_to_all: all N blocks; PS gather phase: its block).
        bytes_uncompressed: bytes of the gradients, what DDP's allreduce hands to its collective.
        encode_ms: time spent encoding (workers and PS servers), with the NaN/Inf checks of
            compressed chunks that the encode does not do itself (a read pass each). On a GPU
            the streams' time from each encode's start to its end.
        decode_ms: time spent decoding, merging and averaging (on a GPU: the streams' time).
        codec_wait_ms: time encode and decode calls waited for each other (they run on the
            hook's and the backend's threads, one at a time); not part of the two above on a
            CPU (on a GPU a host wait, which the streams' times hold only where a stream ran
            dry meanwhile).
        comm_ms: summed time from issuing each collective to its completion (collectives
            overlap each other and encode/decode, so this can exceed ``sync_ms``); on a GPU
            from when the issuing stream reached the collective to when the collective ended.
        wait_ms: time the hook's thread blocked on collectives (on a GPU, where waits are the
            streams', next to none).
        sync_ms: wall time from the step's first bucket to its last completion (on a GPU, in
            the streams' order).
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


_COUNTS = ("buckets", "collectives", "bytes_sent", "bytes_uncompressed")
# how long reading the figures waits for a step's device work before leaving the step out
_WAIT_S = 120.0


def _step_stats(step: int, figures: dict[str, float], sync_ms: float) -> StepStats:
    return StepStats(
        step=step,
        sync_ms=sync_ms,
        **{k: int(v) if k in _COUNTS else v for k, v in figures.items()},
    )


@dataclass
class _Unread:
    """A closed step whose stream-ordered laps are still to be read.

    Fields:
        step: its index.
        figures: its figures recorded so far (``*_ms`` in ms).
        laps: (figure, lap) pairs to add.
        t0: the mark at its first bucket; ends: the marks of each bucket's completion.
    """

    step: int
    figures: dict[str, float]
    laps: list[tuple[str, Lap]]
    t0: Mark
    ends: list[Mark]

    def _all(self) -> list[Lap]:
        return [lap for _, lap in self.laps] + [Lap(self.t0, end) for end in self.ends]

    def ready(self) -> bool:
        return all(lap.ready() for lap in self._all())

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        return all(lap.wait(max(deadline - time.monotonic(), 0.0)) for lap in self._all())

    def read(self) -> StepStats:
        figures = dict(self.figures)
        for figure, lap in self.laps:
            figures[figure] += lap.seconds * 1e3
        sync = max((end.since(self.t0) for end in self.ends), default=0.0)
        return _step_stats(self.step, figures, sync * 1e3)


class SyncStats:
    """Accumulates :class:`StepStats`; keeps the last ``history`` closed steps.

    Read ``last`` (the most recent closed step), ``steps`` (the kept history) or ``mean()``.
    Every ``log_every`` closed steps (0: never) a summary goes to the logger at INFO; every
    closed step goes at DEBUG.

    Fields:
        clocks: makes the clock of a device (:func:`~hipress.casync.clock.clock_for`; tests
            pass :class:`~hipress.casync.clock.HostEvents` clocks to run the GPU's path).
        clock: the current step's clock: strategies mark their collectives with it.
        tracer: the timeline of this rank's steps.
    """

    def __init__(
        self,
        history: int = 1000,
        log_every: int = 100,
        clocks: Callable[[torch.device | None], Clock] = clock_for,
    ) -> None:
        if history < 1:
            raise ValueError(f"history must be >= 1, got {history}")
        if log_every < 0:
            raise ValueError(f"log_every must be >= 0, got {log_every}")
        self.log_every = log_every
        self.clocks = clocks
        self._steps: deque[StepStats] = deque(maxlen=history)
        self._init_runtime()
        self._step = 0
        self._open: dict[str, float] | None = None
        self._outstanding = 0
        self._last_submitted = False

    def _init_runtime(self) -> None:
        """What does not pickle: the lock, the clocks, the laps, the tracer."""
        self._lock = threading.Lock()
        self._clocks: dict[str, Clock] = {}
        self.clock: Clock = Clock()
        self._t0: Mark = HostMark(0.0)
        self._ends: list[Mark] = []
        self._laps: list[tuple[str, Lap]] = []
        self._unread: deque[_Unread] = deque()
        self.tracer = Tracer()

    @property
    def steps(self) -> deque[StepStats]:
        """The kept closed steps, oldest first (waits for the device work of closed steps
        still to be read)."""
        self._read(block=True)
        return self._steps

    @property
    def last(self) -> StepStats | None:
        """The most recent closed step, or None before the first one closes."""
        steps = self.steps
        return steps[-1] if steps else None

    def recent(self, n: int = 1) -> list[StepStats]:
        """The last ``n`` closed steps whose figures are read, oldest first (never waits)."""
        self._read(block=False)
        return list(self._steps)[-n:]

    @property
    def unread(self) -> int:
        """Closed steps whose figures wait for the device to finish their work (never
        waits)."""
        self._read(block=False)
        return len(self._unread)

    def mean(self, last: int | None = None) -> dict[str, float]:
        """Mean of every figure over the kept steps, or over the ``last`` ones (empty if none)."""
        steps = list(self.steps)[-last:] if last else list(self.steps)
        if not steps:
            return {}
        keys = [*_ADDITIVE, "sync_ms", "ratio"]
        rows = [s.as_dict() for s in steps]
        return {k: sum(r[k] for r in rows) / len(rows) for k in keys}

    def _clock_of(self, device: torch.device | None) -> Clock:
        key = str(device)
        clock = self._clocks.get(key)
        if clock is None:
            clock = self._clocks[key] = self.clocks(device)
        return clock

    def bucket_submitted(self, last: bool, device: torch.device | None = None) -> None:
        """Count a bucket (on ``device``) handed to the engine; the first of a step opens the
        step, with the clock of ``device``."""
        with self._lock:
            opened = self._open is None or (self._last_submitted and self._outstanding == 0)
            if opened:
                self.clock = self._clock_of(device)
                self.clock.begin_step()
                self._open = dict.fromkeys(_ADDITIVE, 0.0)
                self._laps, self._ends = [], []
                self._t0 = self.clock.mark()
                self._last_submitted = False
            assert self._open is not None
            self._open["buckets"] += 1
            self._outstanding += 1
            self._last_submitted = self._last_submitted or last
        if opened and self._unread:
            self._read(block=False)

    def add(self, **figures: float) -> None:
        """Add to the open step's figures (names of :class:`StepStats` fields, times in
        seconds for ``*_ms`` fields)."""
        with self._lock:
            if self._open is None:
                return
            for k, v in figures.items():
                self._open[k] += v * 1e3 if k.endswith("_ms") else v

    def add_lap(self, figure: str, lap: Lap) -> None:
        """Add ``lap`` to ``figure`` (a ``*_ms`` field) of the open step: at once if it was
        read off the wall clock, else once its events have completed."""
        if lap.known:
            self.add(**{figure: lap.seconds})
            return
        with self._lock:
            if self._open is not None:
                self._laps.append((figure, lap))

    @contextlib.contextmanager
    def phase(self, name: str, figure: str | None = None) -> Iterator[None]:
        """Time the work of the ``with`` block (kernels, copies) as phase ``name``, a span of
        :attr:`tracer`, and add it to ``figure`` (a ``*_ms`` field) if given. On the host's
        clock the span is the block on the calling thread's lane; on a stream-ordered one the
        block only launches the work (a span of category ``issue`` there) and the work is a
        span on the device lane, of the stream's time."""
        clock = self.clock
        if clock.on_host:
            t = time.perf_counter()
            try:
                with self.tracer.span(name, name):
                    yield
            finally:
                if figure is not None:
                    self.add(**{figure: time.perf_counter() - t})
            return
        start = clock.mark()
        try:
            with self.tracer.span(name, "issue"):
                yield
        finally:
            lap = Lap(start, clock.mark())
            if figure is not None:
                self.add_lap(figure, lap)
            self.tracer.lap(name, name, lap, lane=DEVICE_LANE)

    def timed(self, figure: str) -> contextlib.AbstractContextManager[None]:
        """:meth:`phase` for a figure: its time goes to ``figure`` (``encode_ms``,
        ``decode_ms``), its span is named after it (``encode``, ``decode``)."""
        return self.phase(figure.removesuffix("_ms"), figure)

    def bucket_finished(self) -> None:
        """Count a completed bucket (on a stream-ordered clock, its work is queued on the
        current stream); closes the step when it was the last outstanding one."""
        closed = None
        with self._lock:
            self._outstanding -= 1
            if self._open is not None and not self.clock.on_host:
                self._ends.append(self.clock.mark())
            if not (self._last_submitted and self._outstanding == 0 and self._open is not None):
                return
            figures = self._open
            if self.clock.on_host and not self._laps:
                closed = _step_stats(
                    self._step, figures, (time.perf_counter() - self._t0.at()) * 1e3
                )
                self._steps.append(closed)
            else:
                self._unread.append(_Unread(self._step, figures, self._laps, self._t0,
                                            self._ends))  # fmt: skip
            self._step += 1
            self._open = None
            self._laps, self._ends = [], []
            self._last_submitted = False
        if closed is not None:
            self._log(closed)
        else:
            self._read(block=False)

    def _read(self, block: bool) -> None:
        """Read the closed steps whose laps have completed, oldest first (``block``: all of
        them, waiting for the device; a step not done within a long timeout is left out)."""
        while True:
            with self._lock:
                if not self._unread:
                    return
                head = self._unread[0]
            if not head.ready():
                if not block:
                    return
                if not head.wait(_WAIT_S):
                    logger.warning(
                        "casync: step %d's device work did not complete within %.0f s; its "
                        "figures are left out", head.step, _WAIT_S,
                    )  # fmt: skip
                    with self._lock:
                        if self._unread and self._unread[0] is head:
                            self._unread.popleft()
                    continue
            closed = head.read()
            with self._lock:
                if not self._unread or self._unread[0] is not head:
                    continue  # another thread read it
                self._unread.popleft()
                self._steps.append(closed)
            self._log(closed)

    def _log(self, closed: StepStats) -> None:
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

    def resume(self, step: int) -> None:
        """Count on from ``step`` (a checkpoint's step count): the next step closed is
        numbered ``step``."""
        with self._lock:
            self._step = step

    def abandon_step(self) -> None:
        """Drop the open step (after a failed bucket), so the next bucket opens a new one."""
        with self._lock:
            self._open = None
            self._laps, self._ends = [], []
            self._outstanding = 0
            self._last_submitted = False

    def __getstate__(self) -> dict[str, Any]:
        self._read(block=True)
        d = self.__dict__.copy()
        for name in ("_lock", "_clocks", "clock", "_t0", "_ends", "_laps", "_unread", "tracer"):
            d.pop(name, None)
        return d

    def __setstate__(self, d: dict[str, Any]) -> None:
        if "steps" in d:  # pickled before the steps waited for the device
            d["_steps"] = d.pop("steps")
        d.setdefault("clocks", clock_for)
        self.__dict__.update(d)
        self._init_runtime()
