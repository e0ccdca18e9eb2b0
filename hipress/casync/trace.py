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
from pathlib import Path
from typing import Any

import torch

from hipress.casync.errors import CaSyncError
from hipress.casync.logs import RANK_FILTER

__all__ = ["CATEGORIES", "NETWORK_LANE", "Tracer", "trace_path"]

logger = logging.getLogger(__name__)
logger.addFilter(RANK_FILTER)

#: Span categories: what the breakdown adds up.
CATEGORIES = (
    "step",
    "compute",
    "hook",
    "encode",
    "decode",
    "copy",
    "issue",
    "wait",
    "lock",
    "comm",
)
#: The lane (a Chrome trace "thread") collectives are drawn on.
NETWORK_LANE = "network"

_PROFILER_ON = getattr(torch.autograd, "_profiler_enabled", lambda: False)
# tracers whose recorded steps are done but whose file waits for the next step: written at
# exit if the job ends first
_PENDING: weakref.WeakSet[Tracer] = weakref.WeakSet()


@atexit.register
def _flush() -> None:
    for tracer in list(_PENDING):
        with contextlib.suppress(Exception):
            tracer.stop()


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
        with self._lock:
            self._events = []
            self._steps_left = steps or 0
            self._closing = False
            self._path = path
            self._meta = dict(meta)
            self.written = None

    def stop(self) -> Path | None:
        """Stop keeping spans; write them if a path was given. Returns the file written."""
        with self._lock:
            events, self._events = self._events, None
            self._closing = False
        _PENDING.discard(self)
        if events is None:
            return None
        self._kept = events
        return self._write(events) if self._path is not None else None

    def step_done(self) -> None:
        """CaSync's part of a step ended (its last bucket is synchronised). After the last
        recorded one, the tail of the step (the optimizer) is still kept: the recording stops
        when the next step opens (:meth:`step_opened`), or at :meth:`stop`, or at exit."""
        if self._events is None:
            return
        self.span_event("step-end", "step", time.perf_counter(), 0.0)
        with self._lock:
            if self._steps_left > 0:
                self._steps_left -= 1
                if self._steps_left == 0:
                    self._closing = True
                    _PENDING.add(self)

    def step_opened(self) -> None:
        """A step's first bucket arrived: stop and write if the recorded steps are done."""
        if self._closing:
            self.stop()

    def events(self) -> list[dict[str, Any]]:
        """The spans of the last finished recording (or of the current one), as Chrome
        trace events."""
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
        with self._lock:
            if self._events is not None:
                self._events.append(event)

    def interval(self, name: str, t0: float, t1: float, **args: Any) -> None:
        """A collective (or ring hop) from its issue at ``t0`` to its completion at ``t1``
        on the network lane."""
        self.span_event(name, "comm", t0, max(t1 - t0, 0.0), lane=NETWORK_LANE, **args)

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
        events = _network_lanes(self.events() if events is None else events)
        names = [
            {"name": "process_name", "ph": "M", "pid": self.rank, "args": {"name": f"rank {self.rank}"}},
            {"name": "thread_name", "ph": "M", "pid": self.rank, "tid": NETWORK_LANE,
             "args": {"name": NETWORK_LANE}},
        ]  # fmt: skip
        for lane in sorted({e["tid"] for e in events if e.get("cat") == "comm"} - {NETWORK_LANE}):
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


def _network_lanes(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``events`` with overlapping collectives spread over lanes ``network``, ``network 2``,
    ... (each its first free one), since spans on one lane must nest."""
    out: list[dict[str, Any]] = []
    ends: list[float] = []
    for e in sorted(events, key=lambda e: e["ts"]):
        if e.get("tid") != NETWORK_LANE:
            out.append(e)
            continue
        free = [i for i, end in enumerate(ends) if end <= e["ts"]]
        i = free[0] if free else len(ends)
        if not free:
            ends.append(0.0)
        ends[i] = e["ts"] + e.get("dur", 0.0)
        out.append({**e, "tid": NETWORK_LANE if i == 0 else f"{NETWORK_LANE} {i + 1}"})
    return out
