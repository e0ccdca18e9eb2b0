"""SIGTERM and SIGINT end a command the way an exception does, so that whatever it set up is
taken down on the way out: worker processes stopped, network namespaces (and their tc qdiscs)
deleted, temporary folders removed (the context managers of :mod:`hipress.bench.netsim` and
:mod:`hipress.demo.launch` do it).

Python's default for SIGTERM ends the process at once, leaving all of that behind.
:func:`stop_on_signals` turns the first SIGTERM or SIGINT into :class:`Stopped` (a
``KeyboardInterrupt``, which the benchmarks' ``except Exception`` handlers let through) and
ignores further ones while the command cleans up, so a second signal cannot cut the cleanup short.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

__all__ = ["SIGNALS", "Stopped", "stop_on_signals", "stopped_message"]

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopped(KeyboardInterrupt):
    """The command was stopped by signal ``signum``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop(signum: int, frame: FrameType | None) -> None:
    for s in SIGNALS:  # the cleanup the exception starts runs to its end
        signal.signal(s, signal.SIG_IGN)
    raise Stopped(signum)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Within the block, SIGTERM and SIGINT raise :class:`Stopped` (then are ignored until the
    block ends); the previous handlers come back after it. Outside the main thread (where
    Python cannot take signals) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, _stop) for s in SIGNALS}
    try:
        yield
    finally:
        for s, handler in old.items():
            # None: a handler not set from Python, which cannot be put back; the default then
            signal.signal(s, signal.SIG_DFL if handler is None else handler)


def stopped_message(command: str, exc: KeyboardInterrupt) -> tuple[str, int]:
    """The line to print and the exit status (128 + the signal's number, as a shell reports a
    process ended by it) for ``command`` stopped by ``exc``."""
    signum = getattr(exc, "signum", signal.SIGINT)
    name = signal.Signals(signum).name
    return (
        f"{command}: stopped by {name}; its worker processes were ended and its network "
        "namespaces and temporary files removed",
        128 + int(signum),
    )
