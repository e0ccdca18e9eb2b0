"""Signals around starting processes.

:func:`deferred_signals` holds SIGTERM and SIGINT back while worker processes are started, so
that a command stopped by a signal never leaves a half-started worker (the benchmarks' network
runs, the demo and SeCoPa's local groups use it).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

__all__ = ["deferred_signals"]


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
