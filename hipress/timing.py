"""Timing of calls on a CPU (wall clock) or a GPU (CUDA events), for the benchmarks, the
profiler and the self-test."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch


def time_once(fn: Callable[[], object], cuda: bool = False) -> float:
    """Seconds of one call of ``fn``: wall time, or with ``cuda`` the time between CUDA events
    recorded around it on the current stream (a call there only enqueues work)."""
    if cuda:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / 1e3
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def best_of(fn: Callable[[], object], reps: int, cuda: bool = False) -> float:
    """The fastest of ``reps`` calls after one warm-up call (seconds)."""
    fn()
    return min(time_once(fn, cuda) for _ in range(reps))


def ms_per_call(
    fn: Callable[[], object], reps: int, stat: str = "median", device: Any = None
) -> float:
    """ms of one call of fn over ``reps`` calls: the fastest (``min``) or the ``median``. On a
    CUDA ``device`` each call is timed by CUDA events on the current stream (a call there only
    enqueues work; its collectives make that stream wait for them)."""
    ts = []
    cuda = device is not None and torch.device(device).type == "cuda"
    for _ in range(reps):
        ts.append(time_once(fn, cuda) * 1e3)
    return min(ts) if stat == "min" else statistics.median(ts)
