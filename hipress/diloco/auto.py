"""``plan="auto"``: SeCoPa decides, per fragment, whether its outer gradient is compressed
(the algorithm over an all-gather) or sent uncompressed (an all-reduce), from a profile of the
codec's speed and the link (measured in the group, or passed in) and the compute time of an
inner step (passed in, or timed over the first period), and predicts the compute utilisation
at the user's H (:mod:`hipress.secopa.model.localsteps`).

Rank 0 decides and broadcasts its choices, so every rank runs the same codecs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from hipress.codec.logs import RANK_FILTER
from hipress.core.compression import compresses
from hipress.diloco.config import Choice, resolve_codecs
from hipress.diloco.errors import DiLoCoError
from hipress.diloco.fragments import Schedule
from hipress.secopa.model.localsteps import LocalStepPlan, plan_local_steps, utilisation
from hipress.secopa.model.profile import Profile

__all__ = ["AutoPlan", "auto_plan"]

log = logging.getLogger(__name__)
log.addFilter(RANK_FILTER)


class AutoPlan:
    """The per-fragment choice of ``plan="auto"`` (:attr:`plan`) and the utilisation it predicts
    (:attr:`utilisation`, once a compute time per inner step is known). ``named``: the tensors
    this rank sends (with FSDP2, its rows of each parameter: each group of ranks holding the
    same shard plans its own)."""

    def __init__(self, named: Sequence[tuple[str, torch.nn.Parameter]],
                 frags: Sequence[Sequence[int]], schedule: Schedule, algorithm: Choice,
                 params: Any, group: Any, profile: Profile | None, step_ms: float | None,
                 backend: str) -> None:  # fmt: skip
        if algorithm is None or isinstance(algorithm, dict) or algorithm == "none":
            raise DiLoCoError(
                "plan='auto' chooses per fragment between one algorithm and no compression: "
                f"pass algorithm= a CompLL name or algorithm object, got {algorithm!r}"
            )
        if step_ms is not None and not (isinstance(step_ms, int | float) and step_ms > 0):
            raise DiLoCoError(f"inner_step_ms must be a positive number of ms, got {step_ms!r}")
        alg = resolve_codecs(algorithm, params, ["x"], [named[0][1].device], backend)[0]
        if not compresses(alg):
            raise DiLoCoError(f"plan='auto' needs a compressing algorithm, got {alg.name}")
        self.schedule, self.step_ms = schedule, step_ms
        if profile is None:
            profile = self._measure(alg, group, max(1, *(p.numel() for _, p in named)),
                                    named[0][1])  # fmt: skip
        # a fragment of FSDP2 shards may hold no rows on this rank (dim 0 shorter than the
        # replica): planned as one element, its collective's fixed cost, not the fit's at zero
        numels = [max(1, sum(named[i][1].numel() for i in idx)) for idx in frags]
        size = dist.get_world_size(group)
        mine = plan_local_steps(profile, size, numels, schedule.sync_every, schedule.delay,
                                step_ms) if dist.get_rank(group) == 0 else None  # fmt: skip
        box = [mine]
        src = 0 if group is dist.group.WORLD else dist.get_global_rank(group, 0)
        dist.broadcast_object_list(box, src=src, group=group)
        self.plan: LocalStepPlan = box[0]
        self.utilisation = self.plan.utilisation if step_ms is not None else None
        self.algorithms: dict[str, Choice] = {
            named[i][0]: (algorithm if c.compress else None)
            for idx, c in zip(frags, self.plan.fragments, strict=True) for i in idx
        }  # fmt: skip
        self._first: float | None = None
        log.info("DiLoCo plan='auto': %s", self.plan.line())

    @staticmethod
    def _measure(alg: Any, group: Any, largest: int, p: torch.Tensor) -> Profile:
        from hipress.secopa.measure.runtime import auto_profile

        return auto_profile(alg, group, compute_budget_s=0.5, max_numel=largest,
                            calibrate_step=False, device=p.device)  # fmt: skip

    def inner_step(self, t: int) -> None:
        """Time the first period's inner steps (step ``t``); at its last one, predict the
        utilisation (where no compute time was passed in)."""
        if self.utilisation is not None or t > self.schedule.sync_every:
            return
        now = time.perf_counter()
        if t == 1:
            self._first = now
            return
        if t < self.schedule.sync_every or self._first is None:
            return
        self.step_ms = 1000 * (now - self._first) / (t - 1)
        hidden = self.schedule.delay * self.step_ms
        exposed = [max(0.0, (c.compressed_ms if c.compress else c.plain_ms) - hidden)
                   for c in self.plan.fragments]  # fmt: skip
        self.utilisation = utilisation(exposed, self.step_ms, self.schedule.sync_every)
        log.info("DiLoCo plan='auto': %.1f ms per inner step; predicted utilisation at H=%d: "
                 "%.3f", self.step_ms, self.schedule.sync_every, self.utilisation)  # fmt: skip


def auto_plan(plan: str | None, named: Sequence[tuple[str, torch.nn.Parameter]],
              frags: Sequence[Sequence[int]], schedule: Schedule, algorithm: Choice, params: Any,
              group: Any, profile: Profile | None, step_ms: float | None,
              backend: str) -> AutoPlan | None:  # fmt: skip
    """:class:`AutoPlan` for ``plan="auto"``, None for None; :class:`DiLoCoError` otherwise."""
    if plan is None:
        return None
    if plan != "auto":
        raise DiLoCoError(f"plan must be None or 'auto', got {plan!r}")
    return AutoPlan(named, frags, schedule, algorithm, params, group, profile, step_ms, backend)
