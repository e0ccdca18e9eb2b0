"""Step boundaries for a trace: a mark at the end of every optimizer step while a recording runs
(:class:`OptimizerMarks`), so ``hipress trace`` can time whole steps from one optimizer step to
the next without spans of the training loop's own."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.hooks import RemovableHandle

__all__ = ["OPTIMIZER_MARK", "OptimizerMarks"]

#: The name of the instant (category ``step``) that ends each optimizer step in a trace.
OPTIMIZER_MARK = "optimizer-step"


class OptimizerMarks:
    """Calls ``mark(t)`` (``t``: ``time.perf_counter()``) after every ``Optimizer.step()`` of
    the process between :meth:`start` and :meth:`stop` (torch's hook common to all optimizers;
    registered only while started, so it costs nothing otherwise)."""

    def __init__(self, mark: Callable[[float], None]) -> None:
        self._mark = mark
        self._handle: RemovableHandle | None = None

    def start(self) -> None:
        if self._handle is None:
            self._handle = register_optimizer_step_post_hook(self._hook)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._mark(time.perf_counter())
