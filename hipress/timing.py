"""Timing of calls on a CPU (wall clock) or a GPU (CUDA events), for the benchmarks, the
profiler and the self-test."""

from __future__ import annotations

import time
from collections.abc import Callable

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
