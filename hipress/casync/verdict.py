"""Whether a CaSync plan's compression pays off where it runs: measured against a plain
all-reduce of the same gradients, once, a few steps in (:class:`PlanCheck`).

A plan rests on predictions (SeCoPa's cost model, a profile, a rule). After
:data:`CHECK_STEPS` compressed steps (the first, which compiles and allocates, left out), every
rank takes the time its hook spent per step (encoding, decoding and blocked on collectives:
what the step waits for) and times DDP's alternative there and then: an all-reduce of the
same gradient bytes in DDP's 25 MB buckets, under the same load (the median of up to five
timings, fewer for large models, so one slow all-reduce does not decide). The two figures are reduced
to their maxima over the group (one small all-reduce), so every rank reaches the same verdict.
If compression loses, a warning says by how much, with the plan's prediction; with
``fallback`` (the default for ``plan="auto"``) every rank then runs the plain plan (every
tensor all-reduced; algorithm states dropped) from the next step on, and the plan's
``meta["fallback"]`` records the figures. The plain all-reduce is timed without backward to
hide it, so the comparison leans towards compression: what falls back loses for certain.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from hipress.casync.config import config_digest
from hipress.codec.errors import CaSyncError
from hipress.codec.logs import RANK_FILTER
from hipress.core.plan import Plan, Strategy

__all__ = ["CHECK_STEPS", "PlanCheck", "plain_plan", "plain_repeats", "replan", "review"]

log = logging.getLogger(__name__)
log.addFilter(RANK_FILTER)
CHECK_STEPS = 5  # compressed steps before the check (the first is left out of the figures)
BUCKET_BYTES = 25 << 20  # DDP's default bucket_cap_mb
PLAIN_BYTES = 256 << 20  # the plain all-reduce is timed up to 5 times, within about this many bytes


def plain_plan(plan: Plan, figures: dict[str, float]) -> Plan:
    """``plan`` with every entry all-reduced uncompressed; ``meta["fallback"]`` holds
    ``figures``."""
    entries = tuple(
        dataclasses.replace(e, compress=False, strategy=Strategy.ALLREDUCE, partitions=1)
        for e in plan.entries
    )
    return dataclasses.replace(plan, entries=entries, meta={**plan.meta, "fallback": figures})


@dataclasses.dataclass
class PlanCheck:
    """The one check of a state's plan (see the module docstring).

    Fields:
        fallback: run the plain plan if compression loses (else only warn).
        at_step: the step count at whose start the check runs (warm-up steps +
            :data:`CHECK_STEPS`); None once done.
    """

    fallback: bool
    at_step: int | None

    @classmethod
    def of(cls, plan: Any, fallback: Any, warmup_steps: int) -> PlanCheck:
        """The check of a state made with ``plan`` (checked: ``"auto"``, a Plan or None) and
        ``fallback`` (None: fall back for ``"auto"`` only), after ``warmup_steps``. Raises
        :class:`CaSyncError` for a ``fallback`` that is not True, False or None."""
        if fallback is not None and not isinstance(fallback, bool):
            raise CaSyncError(f"fallback must be True, False or None, got {fallback!r}")
        auto = isinstance(plan, str) and plan == "auto"
        return cls(auto if fallback is None else fallback, warmup_steps + CHECK_STEPS)

    def due(self, step: int, plan: Plan) -> bool:
        """Whether the check runs at the start of step ``step`` of ``plan``: once, at
        :attr:`at_step` (a state resumed past it never checks), for a plan that compresses."""
        if self.at_step is None or step != self.at_step:
            return False
        self.at_step = None
        return any(e.compress for e in plan.entries)

    def verdict(
        self, steps: Sequence[Any], plan: Plan, group: Any, device: torch.device
    ) -> dict[str, float] | None:
        """Compare (a collective: every rank calls it at the same step). ``steps`` are the
        state's :class:`~hipress.casync.stats.StepStats`. Returns the figures when
        compression loses (the caller falls back if :attr:`fallback`), else None."""
        recent = list(steps)[-(CHECK_STEPS - 1) :]
        busy = statistics.fmean(s.encode_ms + s.decode_ms + s.wait_ms for s in recent)
        nbytes = 4 * sum(e.numel for e in plan.entries)
        mine = torch.tensor([busy, _time_allreduce(nbytes, group, device)], dtype=torch.float64)
        both = mine.to(device)
        dist.all_reduce(both, op=dist.ReduceOp.MAX, group=group)
        busy, plain = (float(v) for v in both.cpu())
        predicted = float(plan.totals.get("planned", 0.0))
        said = f"predicted {predicted:.2f} ms, " if predicted else ""
        if busy <= plain:
            log.info("casync: the plan's sync measures %.2f ms per step (%sslowest rank), a "
                     "plain all-reduce of the same gradients %.2f ms: compression pays",
                     busy, said, plain)  # fmt: skip
            return None
        figures = {"measured_ms": busy, "plain_ms": plain, "predicted_ms": predicted}
        what = ("every rank falls back to the plain plan (all-reduce) from the next step"
                if self.fallback else "the plan is kept (pass fallback=True to fall back)")  # fmt: skip
        log.warning(
            "casync: compression loses here: the plan's sync takes %.2f ms per step (%sslowest "
            "rank of %d steps), a plain all-reduce of the same %.1f MB %.2f ms (%.2fx); %s",
            busy, said, len(recent), nbytes / 1e6, plain, busy / plain, what,
        )  # fmt: skip
        return figures


def plain_repeats(nbytes: int) -> int:
    """How many times the plain all-reduce of ``nbytes`` is timed: 5, fewer for models over
    :data:`PLAIN_BYTES` / 5, at least 1 (the same on every rank: the count of collectives)."""
    return max(1, min(5, PLAIN_BYTES // max(1, nbytes)))


def _time_allreduce(nbytes: int, group: Any, device: torch.device) -> float:
    """ms for all-reducing ``nbytes`` of float32 in DDP-sized buckets, on this rank: the median
    of :func:`plain_repeats` timings."""
    numel = max(1, nbytes // 4)
    size = min(numel, BUCKET_BYTES // 4)
    buf = torch.zeros(size, dtype=torch.float32, device=device)
    dist.all_reduce(buf[:1], group=group)  # (a warm connection)
    times = []
    for _ in range(plain_repeats(nbytes)):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        left = numel
        while left > 0:
            n = min(left, size)
            dist.all_reduce(buf[:n], group=group)
            left -= n
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def review(state: Any, rt: Any, device: torch.device) -> Any:
    """Run ``state``'s :class:`PlanCheck` on its runtime ``rt`` (at the start of a step, on
    every rank); return the runtime to run the step with: ``rt``, or a new one of the plain
    plan (the step count carried on) if compression loses and the check falls back."""
    figures = state._check.verdict(state.stats.steps, rt.plan, state.process_group, device)
    if figures is None or not state._check.fallback:
        return rt
    plain = plain_plan(rt.base_plan, figures)
    return replan(state, rt, plain, plain)


def replan(state: Any, rt: Any, plan: Plan, base: Plan, states: Any = None) -> Any:
    """Replace ``state``'s runtime ``rt`` (at the start of a step, on every rank) by one of
    ``plan`` (``base``: its base plan) with ``states`` (None: all-zero), the step count carried
    on; returns it."""
    rt.ctx.ring.close()
    config = config_digest(state.algorithm.digest, plan.digest(), state.seed, state.check_finite,
                           state.warmup_steps, state.params_schedule)  # fmt: skip
    new = state._make_runtime(plan, base, config, states=states)
    new.engine.resume_at(rt.engine.step)
    return new
