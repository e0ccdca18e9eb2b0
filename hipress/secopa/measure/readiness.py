"""When each gradient is ready in backward, measured in a compute-only run.

:class:`ReadyClock` times each parameter's gradient against the end of backward
(post-accumulate-grad hooks); :func:`measure_readiness` runs a few training steps with it and
returns the :class:`~hipress.secopa.model.readiness.Readiness` a profile holds
(:meth:`~hipress.secopa.model.profile.Profile.with_readiness`), from which the planner judges a
plan by the exposed time of the whole step. Nothing may delay backward while it measures: a
:class:`~torch.nn.parallel.DistributedDataParallel` model is measured under ``no_sync()``
(no gradient exchange) and with the names of its module's parameters, as plans name them.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import statistics
import time
from collections.abc import Callable
from typing import Any

from torch import nn

from hipress.core.plan import PlanError
from hipress.secopa.model.readiness import Readiness

log = logging.getLogger(__name__)

__all__ = ["ReadyClock", "measure_readiness"]


class ReadyClock:
    """When each parameter's gradient is ready in backward: its lead over the end of backward,
    in ms, per step while :attr:`on` (post-accumulate-grad hooks on ``model``'s parameters).

    Call :meth:`step_done` right after ``backward()`` returns; :meth:`leads` gives the median
    lead of each parameter over the recorded steps. :meth:`remove` takes the hooks off."""

    def __init__(self, model: nn.Module) -> None:
        self.on = False
        self._now: dict[str, float] = {}
        self._leads: dict[str, list[float]] = {}
        self._handles = [
            p.register_post_accumulate_grad_hook(functools.partial(self._ready, name))
            for name, p in model.named_parameters()
            if p.requires_grad
        ]

    def _ready(self, name: str, _p: Any) -> None:
        if self.on:
            self._now[name] = time.perf_counter()

    def step_done(self) -> None:
        """Backward has just returned: record each gradient's lead over now."""
        end = time.perf_counter()
        for name, t in self._now.items():
            self._leads.setdefault(name, []).append(1e3 * (end - t))
        self._now = {}

    def leads(self) -> dict[str, float]:
        """Parameter name -> median ms between its gradient being ready and backward's end."""
        return {n: statistics.median(v) for n, v in self._leads.items()}

    def remove(self) -> None:
        """Take the hooks off the parameters."""
        for h in self._handles:
            h.remove()
        self._handles = []


def measure_readiness(
    model: nn.Module,
    step: Callable[[], Any],
    steps: int = 5,
    warmup: int = 2,
) -> Readiness:
    """The ready time of each trainable parameter's gradient in ``model``'s backward.

    Args:
        model: the module being trained (a ``DistributedDataParallel`` one is measured with no
            gradient exchange, under ``no_sync()``, and by its module's parameter names).
        step: runs one training step's forward and backward (``loss.backward()``); whatever it
            does besides (an optimizer step, zeroing gradients) is not timed.
        steps: timed steps (the leads are their medians); ``warmup``: untimed steps first.
    Returns the :class:`Readiness`. Raises :class:`PlanError` when ``steps < 1`` or when no
    gradient became ready (``step`` ran no backward).
    """
    if steps < 1 or warmup < 0:
        raise PlanError(
            f"measure_readiness needs steps >= 1 and warmup >= 0, got {steps}, {warmup}"
        )
    inner = getattr(model, "module", model)
    quiet = getattr(model, "no_sync", None)
    clock = ReadyClock(inner)
    backward: list[float] = []
    try:
        for i in range(warmup + steps):
            clock.on = i >= warmup
            t0 = time.perf_counter()
            with quiet() if callable(quiet) else contextlib.nullcontext():
                step()
            if clock.on:
                clock.step_done()
                backward.append(1e3 * (time.perf_counter() - t0))
    finally:
        clock.remove()
    leads = clock.leads()
    if not leads:
        raise PlanError("measure_readiness: no gradient became ready; `step` must run backward")
    total = max(leads.values())
    log.info("readiness: %d gradients, the first ready %.1f ms before backward's end (median of "
             "%d steps)", len(leads), total, steps)  # fmt: skip
    return Readiness(
        leads_ms=leads,
        backward_ms=total,
        steps=steps,
        meta={"step_ms": round(statistics.median(backward), 3)},
    )
