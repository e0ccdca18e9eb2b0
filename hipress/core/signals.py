"""Signals around starting processes.

:func:`deferred_signals` holds SIGTERM and SIGINT back while worker processes are started, so
that a command stopped by a signal never leaves a half-started worker (the benchmarks' network
runs, the demo and SeCoPa's local groups use it). :func:`ready_forkserver` first starts the
forkserver those workers come from and waits until it has imported its modules, so that the
signals are held back for the starts alone, not for that import (seconds, more on a busy
machine).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
import threading
from collections.abc import Iterator

__all__ = ["deferred_signals", "ready_forkserver"]


def _nothing() -> None:
    """A process that only proves the forkserver forks."""


def ready_forkserver(ctx: multiprocessing.context.BaseContext) -> None:
    """Start ``ctx``'s forkserver (a no-op for other start methods) and return once it has
    imported its preload modules and forked one process. Call it before
    :func:`deferred_signals` around the real starts: a signal is acted on at once while this
    waits (the throwaway process's few bytes of instructions are written before the wait, so
    it never starts half-instructed)."""
    if ctx.get_start_method() != "forkserver":
        return
    p = ctx.Process(target=_nothing, name="hipress-forkserver-ready", daemon=True)
    p.start()
    p.join()


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold SIGTERM and SIGINT back for the block and deliver them, to the handlers in force
    before it, when it ends. Around starting worker processes: a signal that arrived while a
    start was writing the new process's instructions would leave it a truncated pickle (and a
    traceback of its own) instead of a process that can be stopped. Outside the main thread
    (where Python takes no signals) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    kinds = (signal.SIGTERM, signal.SIGINT)
    old = {s: signal.signal(s, lambda signum, frame: got.append(signum)) for s in kinds}
    try:
        yield
    finally:
        for s, handler in old.items():
            # None: a handler not set from Python, which cannot be put back; the default then
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        if got:
            signal.raise_signal(got[0])
