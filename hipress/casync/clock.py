"""Timing of CaSync's phases (encode, decode, copies) and collectives in the order the work
runs, for :mod:`~hipress.casync.stats` and :mod:`~hipress.casync.trace` alike.

A :class:`Clock` makes marks (points in the order of the work); a :class:`Lap` is the interval
between two. :func:`clock_for` picks the clock of a device, in one place:

- CPU tensors (gloo, C kernels): a phase's work is done when its call returns and a
  collective's when its future completes, so :class:`Clock` reads the wall clock
  (``time.perf_counter``) there and then: every lap is known at once.
- CUDA tensors: a kernel launch returns before the kernel runs and an NCCL work's future
  completes when the collective is enqueued, so the wall clock would time launching.
  :class:`EventClock` records CUDA events instead, in the streams' order:

  - a phase: an event on the current stream at its start and one at its end. Its time is the
    stream's between them: the work once the stream reached it, and any time the stream sat
    idle waiting for the host to launch it.
  - a collective: the start on the current stream right before it is issued (NCCL's stream
    waits for the current one, so the transfer cannot start earlier); the end on a side stream
    of the clock's that waits for the collective alone (:meth:`Clock.after`), so compute queued
    on the current stream meanwhile does not delay it.
  - absolute times (trace spans): each step records an anchor event on an idle stream together
    with the host time (:meth:`Clock.begin_step`); an event's time is the anchor's plus the
    time elapsed between the two, and never earlier than the host recorded the event.

  Nothing here waits for the device. A lap is read once its events have completed
  (:meth:`Lap.ready`, a query): the stats and the trace read what has completed at the next
  step's start, and wait for the rest when their figures or spans are read.

:class:`HostEvents` stands in for CUDA events on the host (``record``/``query``/
``elapsed_time`` semantics; a collective's event completes when its future does), so the
stream-ordered path runs on gloo in CI.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

__all__ = [
    "Clock",
    "CudaEvents",
    "EventClock",
    "EventMark",
    "HostEvent",
    "HostEvents",
    "HostMark",
    "Lap",
    "clock_for",
]


class Event(Protocol):
    """What :class:`EventClock` needs of an event: ``torch.cuda.Event``'s surface."""

    def query(self) -> bool: ...

    def elapsed_time(self, end: Any) -> float: ...


class EventSource(Protocol):
    """Where :class:`EventClock` gets its events (:class:`CudaEvents`, :class:`HostEvents`)."""

    def now(self) -> Event:
        """An event recorded now on the current stream."""
        ...

    def anchor(self) -> Event:
        """An event recorded now on a stream with nothing queued (it completes at once)."""
        ...

    def after(self, works: Sequence[Any]) -> Event | None:
        """An event completing when ``works`` do, recorded without waiting on the host; None
        when that cannot be had (the caller marks the completion when it sees it)."""
        ...


@dataclass(frozen=True)
class HostMark:
    """A wall-clock time (``time.perf_counter()`` seconds): known at once."""

    t: float

    def ready(self) -> bool:
        return True

    def since(self, start: Any) -> float:
        return self.t - start.t

    def at(self) -> float:
        return self.t


@dataclass(frozen=True)
class Anchor:
    """A step's reference: an event recorded on an idle stream, and the host time then."""

    event: Event
    host: float


@dataclass(frozen=True)
class EventMark:
    """An event in the order of the device's work, read once it has completed.

    Fields:
        event: the event.
        host: the host time just before it was recorded (it cannot complete earlier).
        anchor: the step's anchor, for its absolute time.
    """

    event: Event
    host: float
    anchor: Anchor

    def ready(self) -> bool:
        return bool(self.event.query() and self.anchor.event.query())

    def since(self, start: Any) -> float:
        return start.event.elapsed_time(self.event) / 1e3

    def at(self) -> float:
        offset = self.anchor.event.elapsed_time(self.event) / 1e3
        return max(self.host, self.anchor.host + offset)


Mark = HostMark | EventMark


@dataclass(frozen=True)
class Lap:
    """The interval from ``start`` to ``end`` (two marks of one clock)."""

    start: Mark
    end: Mark

    @property
    def known(self) -> bool:
        """Whether it was read off the wall clock (known at once, never waits)."""
        return isinstance(self.start, HostMark) and isinstance(self.end, HostMark)

    def ready(self) -> bool:
        """Whether both marks have completed (never waits)."""
        return self.end.ready() and self.start.ready()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until :meth:`ready` (polling; None: for as long as it takes); returns whether
        it is."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 1e-4
        while not self.ready():
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(delay)
            delay = min(2 * delay, 0.01)
        return True

    @property
    def seconds(self) -> float:
        """Its length in seconds (once :meth:`ready`)."""
        return self.end.since(self.start)

    def bounds(self) -> tuple[float, float]:
        """Its start and end as ``time.perf_counter()`` seconds (once :meth:`ready`)."""
        return self.start.at(), self.end.at()


class Clock:
    """The host's clock: marks are ``time.perf_counter()`` readings, for work that is done
    when its call returns (a CPU) and collectives that are done when their futures complete
    (gloo).

    Fields:
        on_host: laps are the calling thread's wall time (False: a stream's time).
    """

    on_host = True

    def begin_step(self) -> None:
        """A step starts: anchor the marks that follow (nothing to do on the host)."""

    def mark(self) -> Mark:
        """Now, in the order of the calling thread's work (its current stream)."""
        return HostMark(time.perf_counter())

    def after(self, works: Sequence[Any]) -> Mark | None:
        """The completion of the just-issued ``works``, marked without waiting, or None: the
        caller marks it (:meth:`mark`) when it sees them complete (always, on the host)."""
        return None


class EventClock(Clock):
    """A stream-ordered clock over events of ``events`` (see the module docstring)."""

    on_host = False

    def __init__(self, events: EventSource) -> None:
        self.events = events
        self._anchor: Anchor | None = None

    def begin_step(self) -> None:
        event = self.events.anchor()
        self._anchor = Anchor(event, time.perf_counter())

    def _current(self) -> Anchor:
        if self._anchor is None:
            self.begin_step()
        assert self._anchor is not None
        return self._anchor

    def mark(self) -> Mark:
        anchor, host = self._current(), time.perf_counter()
        return EventMark(self.events.now(), host, anchor)

    def after(self, works: Sequence[Any]) -> Mark | None:
        anchor, host = self._current(), time.perf_counter()
        event = self.events.after(works)
        return None if event is None else EventMark(event, host, anchor)


class CudaEvents:
    """CUDA events of ``device``, for :class:`EventClock`: marks on the current stream, an
    idle stream for anchors, and per issuing thread a side stream for collectives' ends.

    A collective's end: its work's future, which NCCL completes at enqueue, makes the side
    stream wait for the collective's end event (a stream wait; the host does not block); a work
    without a future (a coalesced point-to-point batch, in some torch versions) is waited for
    with ``work.wait()`` on the side stream, also a stream wait unless
    ``TORCH_NCCL_BLOCKING_WAIT=1``. A future that is not complete at issue completes with the
    work itself (not NCCL): then the caller marks the completion when it sees it.

    The streams are high-priority ones from torch's pool: PyTorch's future callbacks run on
    its low-priority pool streams and put kernels there, which would delay these events.
    """

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._lock = threading.Lock()
        self._idle: torch.cuda.Stream | None = None
        self._sides: dict[int, torch.cuda.Stream] = {}

    def _stream(self) -> torch.cuda.Stream:
        return torch.cuda.Stream(self.device, priority=-1)

    @staticmethod
    def _event() -> torch.cuda.Event:
        return torch.cuda.Event(enable_timing=True)

    def now(self) -> torch.cuda.Event:
        event = self._event()
        event.record(torch.cuda.current_stream(self.device))
        return event

    def anchor(self) -> torch.cuda.Event:
        with self._lock:
            if self._idle is None:
                self._idle = self._stream()
            idle = self._idle
        event = self._event()
        event.record(idle)
        return event

    def after(self, works: Sequence[Any]) -> torch.cuda.Event | None:
        futures = []
        for work in works:
            try:
                future = work.get_future()
            except RuntimeError:  # a work without a future
                future = None
            if future is not None and not future.done():
                return None
            futures.append(future)
        ident = threading.get_ident()
        with self._lock:
            side = self._sides.get(ident)
            if side is None:
                side = self._sides[ident] = self._stream()
        event = self._event()
        with torch.cuda.stream(side):
            for work, future in zip(works, futures, strict=True):
                try:
                    if future is not None:
                        future.wait()
                    else:
                        work.wait()
                except Exception:  # a failed collective: its own callbacks report it
                    return None
            event.record(side)
        return event


class HostEvent:
    """``torch.cuda.Event``'s surface on the host: it completes when :meth:`complete` is
    called, at that ``time.perf_counter()`` time; ``elapsed_time`` refuses events that have
    not completed, as CUDA's does."""

    def __init__(self) -> None:
        self._t = 0.0
        self._done = threading.Event()

    def complete(self, t: float | None = None) -> None:
        """Complete it now (or at host time ``t``)."""
        self._t = time.perf_counter() if t is None else t
        self._done.set()

    def query(self) -> bool:
        return self._done.is_set()

    def synchronize(self) -> None:
        self._done.wait()

    def elapsed_time(self, end: HostEvent) -> float:
        """Milliseconds from this event to ``end``."""
        if not (self.query() and end.query()):
            raise RuntimeError("Both events must be completed before calculating elapsed time.")
        return (end._t - self._t) * 1e3


class HostEvents:
    """CUDA events' stand-in on the host, for :class:`EventClock`: the host runs the work, so
    an event recorded "on the current stream" completes at once; a collective's completes when
    its future does (on the backend's thread), and a work without a future gives None (gloo's
    point-to-point works: the caller marks what it sees)."""

    def now(self) -> HostEvent:
        event = HostEvent()
        event.complete()
        return event

    def anchor(self) -> HostEvent:
        return self.now()

    def after(self, works: Sequence[Any]) -> HostEvent | None:
        try:
            futures = [w.get_future() for w in works]
        except RuntimeError:
            return None
        if not futures:
            return self.now()
        event, left, lock = HostEvent(), [len(futures)], threading.Lock()

        def one(_future: Any) -> None:
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                event.complete()

        for future in futures:
            future.add_done_callback(one)
        return event


def clock_for(device: torch.device | str | None) -> Clock:
    """The clock of work on ``device``: stream-ordered CUDA events on a CUDA device, the host's
    wall clock elsewhere (and for None)."""
    if device is not None and torch.device(device).type == "cuda":
        return EventClock(CudaEvents(device))
    return Clock()
