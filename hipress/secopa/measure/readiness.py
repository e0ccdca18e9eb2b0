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
import math
import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hipress.core.plan import PlanError
from hipress.secopa.model.readiness import Readiness

log = logging.getLogger(__name__)

__all__ = ["QUANTUM_MS", "ReadyClock", "agree_readiness", "measure_readiness", "quantise"]

# the grid ready times are rounded to (ms): run-to-run noise below it does not move a plan
QUANTUM_MS = 0.5


class ReadyClock:
    """When each parameter's gradient is ready in backward: its lead over the end of backward,
    in ms, per step while :attr:`on` (post-accumulate-grad hooks on ``model``'s parameters, or
    on the ``(name, parameter)`` pairs given).

    Call :meth:`step_done` right after ``backward()`` returns (or with ``at_last=True`` once
    the last gradient is ready: backward's end is then taken as that gradient's time);
    :meth:`leads` gives the median lead of each parameter over the recorded steps.
    :meth:`remove` takes the hooks off."""

    def __init__(self, model: nn.Module | Iterable[tuple[str, torch.Tensor]]) -> None:
        self.on = False
        self.steps = 0
        self._now: dict[str, float] = {}
        self._leads: dict[str, list[float]] = {}
        named = model.named_parameters() if isinstance(model, nn.Module) else model
        self._handles = [
            p.register_post_accumulate_grad_hook(functools.partial(self._ready, name))
            for name, p in named
            if isinstance(p, torch.Tensor) and p.requires_grad
        ]

    def _ready(self, name: str, _p: Any) -> None:
        if self.on:
            self._now[name] = time.perf_counter()

    def step_done(self, at_last: bool = False) -> None:
        """Backward has just returned (``at_last``: its last gradient is ready): record each
        gradient's lead over now (over the last gradient's time)."""
        end = max(self._now.values(), default=0.0) if at_last else time.perf_counter()
        for name, t in self._now.items():
            self._leads.setdefault(name, []).append(1e3 * max(0.0, end - t))
        self._now = {}
        self.steps += 1

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


def quantise(leads: dict[str, float], quantum_ms: float = QUANTUM_MS) -> dict[str, float]:
    """``leads`` rounded to the nearest multiple of ``quantum_ms`` (half up): two runs whose
    ready times differ by noise well below the quantum give the same times, and the plan."""
    if not (math.isfinite(quantum_ms) and quantum_ms > 0):
        raise PlanError(f"the ready-time quantum must be > 0 ms, got {quantum_ms}")
    return {n: round(math.floor(v / quantum_ms + 0.5) * quantum_ms, 6) for n, v in leads.items()}


def agree_readiness(
    leads: dict[str, float],
    names: list[str],
    steps: int,
    group: Any = None,
    device: Any = None,
    quantum_ms: float = QUANTUM_MS,
) -> Readiness:
    """The ready times every rank holds alike: each of ``names``' lead (``leads``: this rank's,
    a name left out counts 0, ready at the end) is the median over the ranks (one all-gather),
    then rounded to ``quantum_ms`` (:func:`quantise`). Every rank of ``group`` must call it
    with the same ``names``; each returns the same :class:`Readiness`."""
    mine = torch.tensor([float(leads.get(n, 0.0)) for n in names], dtype=torch.float64)
    world = dist.get_world_size(group) if dist.is_initialized() else 1
    if world > 1:
        parts = [torch.zeros_like(mine).to(device or "cpu") for _ in range(world)]
        dist.all_gather(parts, mine.to(device or "cpu"), group=group)
        mine = torch.stack([p.cpu() for p in parts]).median(dim=0).values  # (lower median)
    agreed = quantise(dict(zip(names, mine.tolist(), strict=True)), quantum_ms)
    total = max(agreed.values(), default=0.0)
    return Readiness(
        leads_ms=agreed, backward_ms=total, steps=max(1, steps),
        meta={"source": "casync plan='auto'", "ranks": world, "agreed": "median over ranks",
              "quantum_ms": quantum_ms},
    )  # fmt: skip
