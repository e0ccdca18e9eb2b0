"""A timeline of CaSync's steps: every phase as a span, in your ``torch.profiler`` trace and,
on request, in a trace file of hipress's own.

Every phase CaSync runs is a :class:`Tracer` span: the hook call (``hook``), encoding
(``encode``), decoding (``decode``), copies (``copy``), waits of the hook's thread for a
collective (``wait``), issuing a collective (``issue``), and the turns at the codec lock
(``lock``). Under an active ``torch.profiler`` each span is also a
``torch.profiler.record_function`` range named ``hipress.<phase>``, so it shows next to the
model's forward and backward; when no profiler runs that costs nothing.

Each collective (and each ring hop) is an interval from its issue to its completion on a lane of
its own (``network``): collectives overlap each other and the hook's work, which is the point.

On a GPU, where the host only launches kernels and enqueues collectives, the times come from
events in the streams' order (:mod:`hipress.casync.clock`): the ``network`` intervals run from
when the issuing stream reached each collective to when it ended; each encode, decode and copy
is a span of the stream's time on the ``device`` lane, and the host's part of it (launching) a
span of category ``issue`` named after it on the thread's lane. Such spans are read once the
device has done the work: at the next step's start, or when the spans are read or written
(the file is written once they all are). While recording, the end of every optimizer step is
an instant ``optimizer-step`` (:mod:`hipress.casync.stepmarks`): the step boundaries.

Recording a trace file: :meth:`Tracer.record` (or :meth:`CaSyncState.trace
<hipress.casync.state.CaSyncState.trace>`) keeps the spans of the next ``steps`` steps and
writes them, when the last one ends, as Chrome trace-event JSON (open it in Perfetto or
``chrome://tracing``; ``hipress trace`` prints its breakdown and renders a PNG). One file per
rank; the timestamps are wall-clock microseconds, so the files of ranks on one machine line up.
Code outside CaSync can add its own phases (``tracer.span("forward", "compute")``).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hipress.casync.clock import Lap
from hipress.casync.stepmarks import OPTIMIZER_MARK, OptimizerMarks
from hipress.codec.errors import CaSyncError
from hipress.codec.logs import RANK_FILTER

__all__ = ["CATEGORIES", "DEVICE_LANE", "NETWORK_LANE", "Tracer", "trace_path"]

logger = logging.getLogger(__name__)
logger.addFilter(RANK_FILTER)

#: Span categories: what the breakdown adds up.
CATEGORIES = ("step", "compute", "hook", "encode", "decode", "copy", "issue", "wait", "lock",
              "comm")  # fmt: skip
#: The lane (a Chrome trace "thread") collectives are drawn on.
NETWORK_LANE = "network"
#: The lane of the device's work (GPU encodes, decodes and copies, in the streams' time).
DEVICE_LANE = "device"
# how long reading the spans waits for the device work of a recording before leaving it out
_WAIT_S = 120.0

_PROFILER_ON = getattr(torch.autograd, "_profiler_enabled", lambda: False)
# tracers whose recorded steps are done but whose file waits for the next step: written at
# exit if the job ends first
_PENDING: weakref.WeakSet[Tracer] = weakref.WeakSet()


@atexit.register
def _flush() -> None:
    for tracer in list(_PENDING):
        with contextlib.suppress(Exception):
            tracer.stop()


@dataclass(frozen=True, eq=False)
class _Timed:
    """A span whose lap waits for the device: the recording it goes to and its fields."""

    target: list[dict[str, Any]]
    name: str
    cat: str
    lap: Lap
    tid: int | str
    args: dict[str, Any]


def trace_path(path: str | os.PathLike[str], rank: int) -> Path:
    """Where rank ``rank`` writes a trace asked for at ``path``: ``path`` with ``{rank}``
    filled in; a path without ``{rank}`` gets ``-rank<r>`` before its suffix (a directory:
    ``trace-rank<r>.json`` inside it)."""
    text = os.fspath(path)
    if "{rank}" in text:
        return Path(text.replace("{rank}", str(rank)))
    p = Path(text)
    if p.is_dir() or text.endswith(os.sep) or not p.suffix:
        return p / f"trace-rank{rank}.json"
    return p.with_name(f"{p.stem}-rank{rank}{p.suffix}")


class Tracer:
    """Spans of one rank's steps (see the module docstring). Thread-safe: spans come from the
    hook's thread, the backend's completion threads and the ring thread.

    Args:
        rank: this rank (the trace's process id).
    """

    def __init__(self, rank: int = 0) -> None:
        self.rank = rank
        self._lock = threading.Lock()
        self._events: list[dict[str, Any]] | None = None  # None: not recording
        self._steps_left = 0
        self._path: str | os.PathLike[str] | None = None
        self._meta: dict[str, Any] = {}
        self._threads: dict[int, str] = {}
        self._main = threading.main_thread().ident
        # wall clock = perf_counter + offset: one clock for every rank of a machine
        self._offset = time.time() - time.perf_counter()
        self.written: Path | None = None
        self._kept: list[dict[str, Any]] = []
        self._closing = False  # the recorded steps are done: stop at the next step
        self._laps: list[_Timed] = []  # spans of stream-ordered laps, until their events complete
        self._unwritten: list[dict[str, Any]] | None = None  # done, waiting for its laps
        self._seen = 0  # steps of this process so far: step 0 holds its compile and warm-up
        self._marks = OptimizerMarks(lambda t: self.span_event(OPTIMIZER_MARK, "step", t, 0.0))

    # ---- recording ----------------------------------------------------------------------------

    @property
    def recording(self) -> bool:
        """Whether spans are being kept."""
        return self._events is not None

    def record(
        self,
        path: str | os.PathLike[str] | None = None,
        steps: int | None = 10,
        **meta: Any,
    ) -> None:
        """Keep spans from now on; after ``steps`` more steps end (None: until :meth:`stop`),
        write them to :func:`trace_path` of ``path`` (None: keep them for :meth:`events`).
        ``meta`` goes into the file's ``metadata``."""
        if steps is not None and (not isinstance(steps, int) or steps < 1):
            raise CaSyncError(f"a trace needs steps >= 1 (or None), got {steps!r}")
        if self._unwritten is not None:  # an earlier recording waits for its device spans
            self.stop()
        with self._lock:
            self._events = []
            self._steps_left = steps or 0
            self._closing = False
            self._path = path
            self._meta = dict(meta)
            self.written = None
        self._marks.start()

    def stop(self) -> Path | None:
        """Stop keeping spans; write them if a path was given (after waiting for the device
        work of their stream-ordered spans). Returns the file written."""
        with self._lock:
            events, self._events = self._events, None
            self._closing = False
            if events is None:
                events, self._unwritten = self._unwritten, None
        self._marks.stop()
        self._read(block=True)
        _PENDING.discard(self)
        if events is None:
            return None
        self._kept = events
        return self._write(events) if self._path is not None else None

    def step_done(self) -> None:
        """CaSync's part of a step ended (its last bucket is synchronised). After the last
        recorded one, the tail of the step (the optimizer) is still kept: the recording stops
        when the next step opens (:meth:`step_opened`), or at :meth:`stop`, or at exit."""
        self._seen += 1
        if self._events is None:
            return
        self.span_event("step-end", "step", time.perf_counter(), 0.0, step=self._seen - 1)
        with self._lock:
            if self._steps_left > 0:
                self._steps_left -= 1
                if self._steps_left == 0:
                    self._closing = True
                    _PENDING.add(self)

    def step_opened(self) -> None:
        """A step's first bucket arrived: read the stream-ordered spans whose events have
        completed; stop if the recorded steps are done, and write them once all their spans
        are read (never waits)."""
        if self._laps:
            self._read(block=False)
        if self._closing:
            with self._lock:
                events, self._events = self._events, None
                self._closing = False
                if events is not None:
                    self._unwritten = events
            self._marks.stop()
        self._write_read()

    def _write_read(self) -> None:
        """Write the finished recording if none of its spans waits for the device."""
        with self._lock:
            events = self._unwritten
            if events is None or any(entry.target is events for entry in self._laps):
                return
            self._unwritten = None
        _PENDING.discard(self)
        self._kept = events
        if self._path is not None:
            self._write(events)

    def events(self) -> list[dict[str, Any]]:
        """The spans of the last finished recording (or of the current one), as Chrome
        trace events (after waiting for the device work of their stream-ordered spans)."""
        self._read(block=True)
        self._write_read()
        with self._lock:
            if self._events is not None:
                return list(self._events)
        return list(self._kept)

    # ---- spans --------------------------------------------------------------------------------

    @contextlib.contextmanager
    def span(self, name: str, cat: str, **args: Any) -> Iterator[None]:
        """A phase on the calling thread: a ``record_function`` range under an active
        profiler, and a span of the trace while recording."""
        keep = self._events is not None
        rf = torch.profiler.record_function(f"hipress.{name}") if _PROFILER_ON() else None
        if rf is not None:
            rf.__enter__()
        t = time.perf_counter() if keep else 0.0
        try:
            yield
        finally:
            if rf is not None:
                rf.__exit__(None, None, None)
            if keep:
                self.span_event(name, cat, t, time.perf_counter() - t, **args)

    def span_event(
        self, name: str, cat: str, t0: float, dur: float, lane: str | None = None, **args: Any
    ) -> None:
        """Record a span that started at ``t0`` (``time.perf_counter()``) and lasted ``dur``
        seconds, on the calling thread's lane or on ``lane`` (e.g. :data:`NETWORK_LANE`)."""
        if self._events is None:
            return
        tid: int | str = lane if lane is not None else self._thread_lane()
        event = self._event(name, cat, t0, dur, tid, args)
        with self._lock:
            if self._events is not None:
                self._events.append(event)

    def _event(
        self, name: str, cat: str, t0: float, dur: float, tid: int | str, args: dict[str, Any]
    ) -> dict[str, Any]:
        event = {
            "name": name,
            "cat": cat,
            "ph": "X" if dur > 0 or cat != "step" else "i",
            "ts": (t0 + self._offset) * 1e6,
            "dur": dur * 1e6,
            "pid": self.rank,
            "tid": tid,
        }
        if event["ph"] == "i":
            del event["dur"]
            event["s"] = "t"
        if args:
            event["args"] = args
        return event

    def interval(self, name: str, t0: float, t1: float, **args: Any) -> None:
        """A collective (or ring hop) from its issue at ``t0`` to its completion at ``t1``
        on the network lane."""
        self.span_event(name, "comm", t0, max(t1 - t0, 0.0), lane=NETWORK_LANE, **args)

    def lap(self, name: str, cat: str, lap: Lap, lane: str | None = None, **args: Any) -> None:
        """A span timed by ``lap`` (:mod:`hipress.casync.clock`), on ``lane`` or the calling
        thread's: at once for a lap of the wall clock, else once its events have completed."""
        if self._events is None:
            return
        if lap.known:
            t0, t1 = lap.bounds()
            self.span_event(name, cat, t0, max(t1 - t0, 0.0), lane=lane, **args)
            return
        tid: int | str = lane if lane is not None else self._thread_lane()
        with self._lock:
            if self._events is not None:
                self._laps.append(_Timed(self._events, name, cat, lap, tid, args))

    def _read(self, block: bool) -> None:
        """Turn the stream-ordered laps that have completed into spans, in order (``block``:
        all of them, waiting for the device; one not done within a long timeout is dropped)."""
        with self._lock:
            pending = list(self._laps)
        done: list[tuple[_Timed, dict[str, Any] | None]] = []
        deadline = time.monotonic() + _WAIT_S
        for e in pending:
            if not e.lap.ready() and not (block and e.lap.wait(deadline - time.monotonic())):
                if not block:
                    break
                logger.warning("casync: a device span did not complete; left out of the trace")
                done.append((e, None))
                continue
            t0, t1 = e.lap.bounds()
            done.append((e, self._event(e.name, e.cat, t0, max(t1 - t0, 0.0), e.tid, e.args)))
        with self._lock:
            read = {id(e) for e, _ in done}
            self._laps = [e for e in self._laps if id(e) not in read]
            for e, event in done:
                if event is not None:
                    e.target.append(event)

    def _thread_lane(self) -> int:
        ident = threading.get_ident()
        if ident not in self._threads:
            t = threading.current_thread()
            if ident == self._main:
                label = "main"
            elif t.name.startswith("Dummy"):
                label = "completion"  # a backend thread running a collective's callbacks
            elif t.name.startswith("hipress-casync-ring"):
                label = "ring"
            else:
                label = t.name
            self._threads[ident] = label
        return ident

    # ---- writing ------------------------------------------------------------------------------

    def to_json(self, events: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The Chrome trace-event document of ``events`` (default: :meth:`events`): the spans,
        lane names, and ``metadata`` (rank, what :meth:`record` was given)."""
        events = self.events() if events is None else events
        events = _spread(_spread(events, NETWORK_LANE), DEVICE_LANE)
        names = [
            {"name": "process_name", "ph": "M", "pid": self.rank, "args": {"name": f"rank {self.rank}"}},
            {"name": "thread_name", "ph": "M", "pid": self.rank, "tid": NETWORK_LANE,
             "args": {"name": NETWORK_LANE}},
        ]  # fmt: skip
        for lane in sorted({e["tid"] for e in events if isinstance(e["tid"], str)}
                           - {NETWORK_LANE}):  # fmt: skip
            names.append(
                {"name": "thread_name", "ph": "M", "pid": self.rank, "tid": lane,
                 "args": {"name": lane}}
            )  # fmt: skip
        for ident, label in self._threads.items():
            names.append(
                {"name": "thread_name", "ph": "M", "pid": self.rank, "tid": ident,
                 "args": {"name": label}}
            )  # fmt: skip
        return {
            "traceEvents": names + events,
            "displayTimeUnit": "ms",
            "metadata": {"rank": self.rank, "hipress_trace": 1, **self._meta},
        }

    def _write(self, events: list[dict[str, Any]]) -> Path:
        assert self._path is not None
        path = trace_path(self._path, self.rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(self.to_json(events)))
        tmp.replace(path)
        self.written = path
        logger.info("casync: trace of rank %d written to %s", self.rank, path)
        return path


def _spread(events: list[dict[str, Any]], lane: str) -> list[dict[str, Any]]:
    """``events`` with the overlapping spans of ``lane`` (collectives on ``network``, the
    streams' work on ``device``) spread over lanes ``lane``, ``lane 2``, ... (each its first
    free one), since spans on one lane must nest."""
    out: list[dict[str, Any]] = []
    ends: list[float] = []
    for e in sorted(events, key=lambda e: e["ts"]):
        if e.get("tid") != lane:
            out.append(e)
            continue
        free = [i for i, end in enumerate(ends) if end <= e["ts"]]
        i = free[0] if free else len(ends)
        if not free:
            ends.append(0.0)
        ends[i] = e["ts"] + e.get("dur", 0.0)
        out.append({**e, "tid": lane if i == 0 else f"{lane} {i + 1}"})
    return out
