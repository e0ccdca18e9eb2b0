"""The ``bucket_cap_mb`` a job should give DDP: the one whose step exposes the least.

DDP's buckets (:mod:`~hipress.secopa.model.ddpbuckets`) decide when bytes may leave: a bucket
is handed to the hook once its last gradient is ready. With the default cap, the gradient
ready last (an LM's input embedding) shares its bucket with the gradients that joined it since
the previous bucket closed, and their bytes leave only when backward ends. A smaller cap closes
buckets sooner, so more bytes leave while backward still runs, at the price of more
collectives (each with its latency and CaSync's cost per call).

:func:`recommend_cap` plans the job at each candidate cap (DDP's default, and each of
:data:`CANDIDATES_MB`; the planner's choices depend on the buckets), predicts each plan's
exposed step time over the buckets DDP rebuilds in ready order
(:meth:`~hipress.secopa.model.planner.Planner.exposed`), and takes the least. Close calls are
broken by a fixed order, not by noise: every candidate within the tie band of the best
(``max(tie_abs_ms, tie_rel * best, tie_rel * backward)``: a change of DDP's configuration must
gain a few percent of backward) counts as tied; DDP's default wins a tie (nothing to change),
else the largest tied cap (the fewest collectives). The tie is logged and recorded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hipress.core.plan import Plan, PlanError
from hipress.secopa.model.ddpbuckets import BucketCaps, ddp_caps, ready_buckets
from hipress.secopa.model.exposure import Tolerance
from hipress.secopa.model.planner import Planner, PlannerConfig
from hipress.secopa.model.profile import Profile
from hipress.secopa.model.rowcost import RowDensity

__all__ = ["CANDIDATES_MB", "CapAdvice", "candidates", "late_bucket", "recommend_cap"]

log = logging.getLogger(__name__)

CANDIDATES_MB = (1.0, 2.0, 4.0, 8.0, 16.0, 25.0, 64.0, 256.0)
MIB = 2**20


@dataclass(frozen=True)
class CapAdvice:
    """The recommended caps and why.

    Fields:
        caps: the recommendation (``caps.default``: keep DDP's default, pass nothing).
        exposed_ms: predicted exposed ms a step at each candidate, by its label.
        reason: one sentence for people.
        tied: the labels of the candidates within the tie band of the best (empty: no tie).
        plans: the plan made at each candidate, by its label (not saved).
    """

    caps: BucketCaps
    exposed_ms: Mapping[str, float]
    reason: str
    tied: tuple[str, ...] = ()
    plans: Mapping[str, Plan] = field(default_factory=dict, repr=False)

    @property
    def plan(self) -> Plan:
        """The plan made at the recommended caps."""
        return self.plans[self.caps.label()]

    def to_dict(self) -> dict[str, Any]:
        """What a plan file's ``meta["bucket_cap"]`` holds."""
        return {**self.caps.to_dict(), "reason": self.reason, "tied": list(self.tied),
                "exposed_ms": {k: round(v, 6) for k, v in self.exposed_ms.items()}}  # fmt: skip


def candidates(first_is_cap: bool = True, caps: Sequence[float] = CANDIDATES_MB) -> list[BucketCaps]:
    """DDP's default, then each of ``caps`` as given explicitly (:func:`ddp_caps`)."""
    return [ddp_caps(None), *(ddp_caps(c, first_is_cap) for c in sorted(set(caps)))]


def late_bucket(
    names: Sequence[str], numels: Sequence[int], leads: Sequence[float], caps: BucketCaps
) -> dict[str, Any]:
    """The bucket released last at ``caps``: the gradient ready last in it (``name``, its
    ``mb``), the MB of the others (``others_mb``) and the most ms any of them is ready
    before it (``waits_ms``)."""
    last = ready_buckets(numels, leads, caps.cap_mb, caps.first_mb)[-1]
    i = min(last, key=lambda j: (leads[j], j))
    others = [j for j in last if j != i]
    return {"name": names[i], "mb": 4 * numels[i] / MIB,
            "others_mb": sum(4 * numels[j] for j in others) / MIB,
            "waits_ms": max((leads[j] - leads[i] for j in others), default=0.0)}  # fmt: skip


def _reason(pick: BucketCaps, best: float, default_ms: float, late: dict[str, Any]) -> str:
    held = (f"with DDP's default the bucket ready last holds {late['name']} "
            f"({late['mb']:.1f} MB) and {late['others_mb']:.1f} MB of gradients ready up to "
            f"{late['waits_ms']:.0f} ms before it, which wait for it")  # fmt: skip
    if pick.default:
        return (f"keep DDP's default: its step is predicted to expose {best:.1f} ms, the least "
                f"of the candidates (or within the tie band of it); {held}")  # fmt: skip
    return (f"bucket_cap_mb={pick.cap_mb:g}: predicted exposed {best:.1f} ms a step against "
            f"{default_ms:.1f} ms with DDP's default; {held}")  # fmt: skip


def recommend_cap(
    named: Sequence[tuple[str, int]],
    profile: Profile,
    world_size: int,
    config: PlannerConfig | None = None,
    rows: Mapping[str, RowDensity] | None = None,
    *,
    plain: Collection[str] = (),
    finish: Callable[[Plan], Plan] | None = None,
    first_is_cap: bool = True,
    caps: Sequence[float] = CANDIDATES_MB,
) -> CapAdvice:
    """Plan ``named`` at each candidate cap and recommend the one whose step exposes the
    least (module docstring). ``plain``: parameters each plan keeps uncompressed
    (:meth:`~hipress.secopa.model.planner.Planner.plan`); ``finish``: applied to each plan
    before it is judged; ``first_is_cap``: torch's handling of an explicit cap
    (:func:`~hipress.secopa.model.ddpbuckets.ddp_caps`). Needs the profile's ready times;
    raises :class:`PlanError` without them. Deterministic."""
    ready = profile.readiness
    if ready is None:
        raise PlanError(
            "recommending a bucket_cap_mb needs the gradients' ready times in the profile "
            "(hipress.secopa.measure_readiness, or hipress plan --readiness FILE)"
        )
    config = config or PlannerConfig()
    scored: list[tuple[float, BucketCaps]] = []
    plans: dict[str, Plan] = {}
    base = Planner(profile, world_size, config)
    for c in candidates(first_is_cap, caps):
        planner = base.at_caps(c.cap_mb, c.first_mb)
        plan = planner.plan(named, rows, plain)
        plan = finish(plan) if finish is not None else plan
        plans[c.label()] = plan
        scored.append((planner.exposed(plan), c))
    best = min(ms for ms, _ in scored)
    # a change of DDP's configuration must be worth a few percent of backward, not of the
    # (possibly tiny) exposed time: the link's per-call costs are the model's least sure part
    tol = Tolerance(config.tie_rel, config.tie_abs_ms)
    backward = max([ready.backward_ms, *ready.leads_ms.values()])
    band = max(tol.band(best), config.tie_rel * backward)
    near = [c for ms, c in scored if ms <= best + band]
    pick = next((c for c in near if c.default), None) or max(near, key=lambda c: c.cap_mb)
    exposed = {c.label(): ms for ms, c in scored}
    tied = tuple(c.label() for c in near) if len(near) > 1 else ()
    if tied:
        log.info("plan: bucket caps within %.3f ms of the least exposed step (%.3f ms): %s; "
                 "took %s (DDP's default if tied, else the largest cap)", band, best,
                 ", ".join(tied), pick.label())  # fmt: skip
    names, numels = [n for n, _ in named], [int(k) for _, k in named]
    leads = [ready.lead(n) for n in names]
    late = late_bucket(names, numels, leads, ddp_caps(None))
    reason = _reason(pick, exposed[pick.label()], exposed[ddp_caps(None).label()], late)
    log.info("plan: %s", reason)
    return CapAdvice(pick, exposed, reason, tied, plans)
