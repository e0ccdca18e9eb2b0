"""Waiting for an asynchronous collective until the backend has let go of its tensors.

``work.wait()`` returns once the collective's result is ready; the backend's worker thread (a
gloo work thread) still holds the ``Work``, and with it the collective's tensors, for a moment
after. When that thread drops the last reference, recent torch hands each tensor's Python object
back, which takes the GIL. If by then the interpreter is shutting down (the script ended right
after its last collective, and the process group outlived ``destroy_process_group`` because
another torch module holds it), taking the GIL ends the thread and the process aborts with
"terminate called without an active exception".

:meth:`InFlight.wait` waits for the collective, then (the GIL released) until the worker has
dropped the tensors, so that a finished collective leaves nothing for a worker thread to do.
Where hipress cannot wait like that (a collective it does not wait for itself: DDP's hook, an
FSDP reduce-scatter), :func:`settle_at_exit` makes the process pause a moment at exit, before
the interpreter stops handing out the GIL.
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["InFlight", "settle_at_exit"]

# long enough for any worker thread to drop a finished Work; past it, wait no more (a backend
# that keeps its tensors longer, e.g. until its next collective, is not an error)
RELEASE_TIMEOUT_S = 1.0


# how long a process that ran hipress collectives pauses at exit
SETTLE_S = 0.05
_IN_USE = threading.Event()


def settle_at_exit() -> None:
    """Have this process pause :data:`SETTLE_S` at exit (once, however often called): the
    backend's threads release their finished works, taking the GIL, while it is still given."""
    _IN_USE.set()


@atexit.register
def _settle() -> None:
    if _IN_USE.is_set():
        time.sleep(SETTLE_S)


def _use_count(t: torch.Tensor) -> int:
    """References to ``t`` held outside Python (views of it, C++ owners such as a Work)."""
    count: Callable[[], int] | None = getattr(t, "_use_count", None)
    return count() if count is not None else 0


class InFlight:
    """A collective in flight: its ``Work`` (None once waited for) and the tensors it holds."""

    def __init__(self, issue: Callable[[], Any], tensors: Sequence[torch.Tensor]) -> None:
        """Call ``issue`` (an ``async_op=True`` collective on ``tensors``) and keep its
        ``Work``. Only CPU tensors are waited for: a GPU collective's ``wait`` returns before
        the GPU has run it, and its backend keeps the tensors until then, which must not
        block the caller."""
        self.tensors = tuple(t for t in tensors if t.device.type == "cpu")
        self.counts = [_use_count(t) for t in self.tensors]
        self.work: Any = issue()

    def wait(self, guard: Callable[[Callable[[], Any]], Any] = lambda fn: fn(),
             timeout_s: float = RELEASE_TIMEOUT_S) -> None:  # fmt: skip
        """Wait for the collective (``guard(work.wait)``: ``guard`` may turn a failure into
        another error), then sleep until the backend has dropped every tensor, at most
        ``timeout_s``. Waiting again does nothing."""
        work, self.work = self.work, None
        if work is None:
            return
        guard(work.wait)
        del work  # the backend's reference is the last: it drops it while we sleep
        deadline = time.monotonic() + timeout_s
        while any(_use_count(t) > c for t, c in zip(self.tensors, self.counts, strict=True)):
            if time.monotonic() > deadline:
                return
            time.sleep(0.0001)
