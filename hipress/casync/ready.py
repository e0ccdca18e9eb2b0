"""``plan="auto"`` with the gradients' ready times: :class:`ReadyProbe`.

SeCoPa judges a plan by the exposed time of the whole step once it knows when each gradient
is ready in backward (:mod:`hipress.secopa.model.exposure`): rows or dense for an embedding,
and the DDP ``bucket_cap_mb`` to use. A state made with ``plan="auto"`` and ``ready_steps=N``
(N > 0; :data:`READY_STEPS` is a good N) from a model's parameters measures those times
itself: its first N steps are synchronised
uncompressed (DDP's own all-reduce, bit for bit, like ``warmup_steps``, each step's buckets
handed over together once its last gradient is ready, so that no all-reduce runs during the
backward being timed) while a :class:`~hipress.secopa.measure.readiness.ReadyClock` stamps each
gradient as it is accumulated; at the start of the next step every rank takes the median lead over the ranks,
rounded to :data:`~hipress.secopa.measure.readiness.QUANTUM_MS` (the same times on every
rank, and run-to-run noise below the grid moves no plan), and SeCoPa plans with them. The plan
records the times (``meta["readiness"]``) and the recommended cap (``meta["bucket_cap"]``),
which is logged with the constructor argument to pass: DDP's buckets are fixed when the
model is wrapped, so the cap applies to the next launch.

With ``ready_steps=0`` (the default), a multi-round algorithm, or a state made from
``(name, numel)`` pairs (no parameters to hook), ``"auto"`` plans at the first step without
ready times.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any

import torch

from hipress.codec.errors import CaSyncError
from hipress.codec.logs import RANK_FILTER
from hipress.core.plan import Plan
from hipress.secopa.measure.readiness import ReadyClock, agree_readiness
from hipress.secopa.model.readiness import Readiness

__all__ = ["READY_STEPS", "ReadyProbe"]

log = logging.getLogger(__name__)
log.addFilter(RANK_FILTER)

READY_STEPS = 3  # the steps to measure we advise (the leads are their medians: the first
# step's start-up costs do not count)


class ReadyProbe:
    """The ready-time measurement of one state (see the module docstring).

    Fields:
        steps: the steps measured before planning (0: not measuring).
        readiness: the agreed ready times, once measured (None before, or when not measuring).
    """

    def __init__(self, clock: ReadyClock | None, steps: int) -> None:
        self.clock = clock
        self.steps = steps
        self.readiness: Readiness | None = None
        self._stand_in: Plan | None = None  # the plan run while measuring
        self._held: list[tuple[torch.Tensor, Sequence[str], Any]] = []  # (a step's buckets)

    @classmethod
    def of(cls, plan_arg: Any, multi: bool, named: list[tuple[str, Any]],
           steps: int = 0) -> ReadyProbe:  # fmt: skip
        """The probe of a state made with ``plan_arg`` over ``named`` parameters: measuring
        ``steps`` steps for ``"auto"`` over real parameters with a single-round algorithm,
        else idle. Raises :class:`CaSyncError` for a ``steps`` that is not a whole number
        >= 0."""
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise CaSyncError(f"ready_steps must be a whole number >= 0 (0: plan='auto' plans "
                              f"at the first step, without ready times), got {steps!r}")  # fmt: skip
        tensors = [(n, p) for n, p in named if isinstance(p, torch.Tensor) and p.requires_grad]
        auto = isinstance(plan_arg, str) and plan_arg == "auto"
        if not auto or multi or not tensors or not steps:
            return cls(None, 0)
        clock = ReadyClock(tensors)
        clock.on = True
        return cls(clock, steps)

    def start(self, warmup_steps: int) -> int:
        """The first step run with the real plan: after ``warmup_steps`` and the measurement."""
        return max(warmup_steps, self.steps)

    def waiting(self, plan_arg: Any) -> bool:
        """Whether ``plan_arg`` is to be planned later, once the ready times are measured."""
        return (self.clock is not None and self.readiness is None
                and isinstance(plan_arg, str) and plan_arg == "auto")  # fmt: skip

    def started(self, rt: Any, stand_in: bool) -> None:
        """Runtime ``rt`` was made: a stand-in one (``stand_in``) runs uncompressed until
        the measurement ends."""
        if not stand_in:
            return
        self._stand_in = rt.plan
        rt.engine.warmup_steps = max(rt.engine.warmup_steps, self.steps)
        log.info("casync: plan='auto': timing when each gradient is ready over the first %d "
                 "steps (synchronised uncompressed), then planning", self.steps)  # fmt: skip

    def submit(self, rt: Any, buffer: torch.Tensor, names: Sequence[str], last: bool,
               group: Any) -> torch.futures.Future[torch.Tensor]:  # fmt: skip
        """Hand a bucket to ``rt``'s engine; while measuring, hold the step's buckets until
        its ``last`` one (so no all-reduce shares the cores with the backward being timed),
        record the step's leads, then hand them all over in order."""
        clock = self.clock
        if clock is None or not clock.on:
            return rt.engine.submit(buffer, names, last, group)
        out: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        self._held.append((buffer, names, out))
        if not last:
            return out
        clock.step_done(at_last=True)
        clock.on = clock.steps < self.steps
        held, self._held = self._held, []
        for j, (buf, bn, fut) in enumerate(held):
            done = rt.engine.submit(buf, bn, j == len(held) - 1, group)
            done.then(functools.partial(_settle, fut))
        return out

    def due(self, rt: Any) -> bool:
        """Whether to plan now, at the start of a step of ``rt`` (once: a state that
        restored a checkpoint's plan runs that and stops measuring)."""
        if self.clock is None:
            return False
        if self._stand_in is None or rt.plan is not self._stand_in:
            self._stop()
            return False
        return rt.engine.step >= self.steps

    def adopt(self, state: Any, rt: Any, device: torch.device) -> Any:
        """Agree on the ready times, plan ``"auto"`` with them and run that plan from this
        step on (a collective, on every rank): returns the new runtime."""
        assert self.clock is not None
        leads, steps = self.clock.leads(), self.clock.steps
        self._stop()
        names = [n for n, _ in state._numels]
        self.readiness = agree_readiness(leads, names, steps, state.process_group, device)
        step = rt.engine.step
        rt.ctx.ring.close()
        state._rt = None
        state._rows.rows, state._rows.touched = None, {}  # (counted under the new plan)
        new = state._adopt("auto")
        new.engine.resume_at(step)
        state._after_step(step)
        _log_cap(new.plan)
        return new

    def _stop(self) -> None:
        if self.clock is not None:
            self.clock.remove()
        self.clock, self._stand_in = None, None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "clock": None, "_stand_in": None, "_held": []}  # (hooks)


def _settle(out: torch.futures.Future[torch.Tensor], done: torch.futures.Future[torch.Tensor]) -> None:
    """Complete a held bucket's future ``out`` as the engine's ``done`` completed."""
    try:
        out.set_result(done.value())
    except Exception as exc:  # (the engine's CommError reaches DDP as it would have)
        out.set_exception(exc)


def _log_cap(plan: Plan) -> None:
    """Log the bucket cap SeCoPa recommends, as the DDP constructor argument to pass."""
    advice = dict(plan.meta.get("bucket_cap") or {})
    if not advice:
        return
    cap = advice.get("bucket_cap_mb")
    arg = ("DistributedDataParallel(model) (DDP's default bucket_cap_mb)" if cap is None
           else f"DistributedDataParallel(model, bucket_cap_mb={cap:g})")  # fmt: skip
    log.info("casync: plan='auto': %s; pass %s at the next launch (DDP's buckets are fixed "
             "when the model is wrapped)", advice.get("reason", ""), arg)  # fmt: skip
