"""The exposed time of a whole step, and the per-tensor choices that lower it.

Without ready times, the planner judges a plan by the sum of its buckets' predicted times, as if
every gradient were ready at once. With them (:class:`~hipress.secopa.model.readiness.Readiness`
in the profile), a plan's cost is the time the step exposes after backward, from a timeline of
one step (:meth:`Exposure.total`):

- DDP's buckets, formed in the order the gradients become ready (as DDP rebuilds them after
  its first step: :func:`ready_buckets`), run in order, each once its last gradient is ready;
- a bucket's rounds (:meth:`~hipress.secopa.model.costmodel.CostModel.bucket_rounds`) each
  compute (encode, decode, merge), then use the link (latency included); a round's link time
  overlaps the next round's compute (the pipeline) and backward;
- the hook's compute runs on the cores backward runs on: compute issued before the end of
  backward delays backward by as much, so every bucket's compute is exposed in full;
- ``exposed = max(end of compute, end of the link) - backward_ms``.

So the link time of the gradients ready early hides behind the rest of backward, that of the
gradients ready last does not (what ``hipress bench e2e`` calls the network floor is the least
it can be), and the encode and decode of every tensor count.

:func:`refine` starts from the sum-of-costs plan and chooses, for each compressed tensor (the
tensor ready last first), the compressed (strategy, K) with the least exposed time. The set of
compressed tensors is the sum-of-costs plan's (so "compress exactly the tensors above a size"
holds). Close calls are broken by a fixed order rather than by noise: every candidate within
the tolerance band of the best (:class:`Tolerance`: ``max(tie_abs_ms, tie_rel * t)``, t the
tensor's own predicted time) counts as tied, and the
first in the preference order wins: fewer partitions, then CaSync's default strategy for the
world size, then the planner's strategy order. Each tie is logged and recorded.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from hipress.core.plan import Strategy
from hipress.core.rule import DefaultRule
from hipress.secopa.model.costmodel import Choice, CostModel, Member
from hipress.secopa.model.ddpbuckets import ready_buckets
from hipress.secopa.model.readiness import Readiness

log = logging.getLogger(__name__)

__all__ = ["Exposure", "Tolerance", "preference", "ready_buckets", "refine"]

MAX_PASSES = 4  # a change to one tensor can move the timeline for the others: a few passes settle
Rounds = list[tuple[float, float]]


@dataclass(frozen=True)
class Tolerance:
    """A tensor's candidates within ``max(abs_ms, rel * own_ms)`` of its best exposed time are
    tied, ``own_ms`` the least predicted time of the tensor alone among them: a band in
    proportion to the tensor, so that all ties together cost at most ``rel`` of the plan's
    summed time."""

    rel: float = 0.03
    abs_ms: float = 0.1

    def band(self, own_ms: float) -> float:
        return max(self.abs_ms, self.rel * own_ms)


class Exposure:
    """The exposed time of a step whose tensors run as given (see the module docstring).

    Args:
        model: the cost model.
        names: the parameters, in model order.
        buckets: DDP's buckets in the order they run (parameter indices,
            :func:`ready_buckets`).
        readiness: the measured ready times; a gradient it does not hold counts as ready at
            the end of backward.
    """

    def __init__(
        self,
        model: CostModel,
        names: Sequence[str],
        buckets: Sequence[Sequence[int]],
        readiness: Readiness,
    ) -> None:
        self.model = model
        self.buckets = [list(b) for b in buckets]
        self.bucket_of = {i: j for j, b in enumerate(self.buckets) for i in b}
        leads = [readiness.lead(n) for n in names]
        self.backward_ms = max([readiness.backward_ms, *leads])
        # a bucket is ready when its last gradient is (the smallest lead of its members), and
        # not before the bucket ahead of it: the hook runs buckets in order
        self.release: list[float] = []
        for b in self.buckets:
            at = self.backward_ms - min(leads[i] for i in b)
            self.release.append(max(at, self.release[-1]) if self.release else at)

    def bucket_rounds(self, members: Sequence[Member]) -> Rounds:
        """One bucket's rounds ``(compute ms, link ms)``."""
        return self.model.bucket_rounds(members)

    def parts(self, members: Sequence[Member]) -> list[Rounds]:
        """:meth:`bucket_rounds` of every bucket, for one :class:`Member` per parameter."""
        return [self.bucket_rounds([members[i] for i in b]) for b in self.buckets]

    def total(self, parts: Sequence[Rounds]) -> float:
        """Exposed ms of a step from each bucket's rounds (module docstring)."""
        cpu = done = link = 0.0  # wall clock of the cores, backward's progress, the link
        for release, rounds in zip(self.release, parts, strict=True):
            if done < release:  # backward runs until this bucket is ready
                cpu, done = cpu + release - done, release
            for c, w in rounds:
                cpu += c
                link = max(cpu, link) + w
        cpu += self.backward_ms - done
        return max(cpu, link) - self.backward_ms

    def of(self, members: Sequence[Member]) -> float:
        """Exposed ms of a step with one :class:`Member` per parameter."""
        return self.total(self.parts(members))


def _label(c: Choice) -> str:
    return f"{c.strategy.value if c.strategy else c.name} K={c.k}"


def preference(strategies: Sequence[Strategy], world_size: int) -> dict[Strategy, int]:
    """Rank of each compressed strategy for ties: CaSync's default strategy for
    ``world_size`` first, then ``strategies``' order."""
    default = DefaultRule(min_compress_numel=1).entry("t", 1 << 20, world_size).strategy
    order = [default, *[s for s in strategies if s is not default]]
    return {s: i for i, s in enumerate(order)}


def _choose(
    exposure: Exposure,
    i: int,
    cur: Sequence[Member],
    parts: Sequence[Rounds],
    candidates: Sequence[Choice],
    rank: dict[Strategy, int],
    tol: Tolerance,
) -> tuple[Member, Rounds, dict[str, object] | None]:
    """Tensor i's member by the exposed time of the step, the other tensors as in ``cur``:
    the member, its bucket's new rounds, and the near tie it broke (None if there was none)."""
    j = exposure.bucket_of[i]
    scored = []
    for c in candidates:
        m = Member(c.name, cur[i].numel, c.k)
        trial = list(parts)
        trial[j] = exposure.bucket_rounds([m if x == i else cur[x] for x in exposure.buckets[j]])
        scored.append((exposure.total(trial), c, m, trial[j]))
    best = min(s for s, *_ in scored)
    near = [x for x in scored if x[0] <= best + tol.band(min(c.ms for c in candidates))]
    ms, pick, member, bucket = min(near, key=lambda x: (x[1].k, rank.get(x[1].strategy, 99)))
    tie = None
    if len(near) > 1:
        tied = {_label(c): round(s, 6) for s, c, *_ in near}
        tie = {"took": _label(pick), "exposed_ms": round(ms, 6), "tied": tied}
    return member, bucket, tie


def refine(
    exposure: Exposure,
    names: Sequence[str],
    members: Sequence[Member],
    candidates: Sequence[Sequence[Choice]],
    readiness: Readiness,
    rank: dict[Strategy, int],
    tol: Tolerance,
) -> tuple[list[Member], dict[str, object]]:
    """Each compressed tensor's (strategy, K) by the exposed time of the step.

    ``members`` is the starting plan (one per parameter), ``candidates[i]`` the compressed
    choices tensor i may take (empty: tensor i keeps its member). Tensors are visited ready
    last first, in passes until nothing changes. Returns the members and a record: the
    exposed ms before and after, the tensors that changed and the near ties. Deterministic.
    """
    cur = list(members)
    parts = exposure.parts(cur)
    before = exposure.total(parts)
    order = sorted((i for i, c in enumerate(candidates) if c),
                   key=lambda i: (readiness.lead(names[i]), i))  # fmt: skip
    ties: dict[str, dict[str, object]] = {}
    for _ in range(MAX_PASSES):
        changed = False
        for i in order:
            new, bucket, tie = _choose(exposure, i, cur, parts, candidates[i], rank, tol)
            ties.pop(names[i], None)
            if tie is not None:
                ties[names[i]] = tie
            if new != cur[i]:
                cur[i], parts[exposure.bucket_of[i]], changed = new, bucket, True
        if not changed:
            break
    for name, t in sorted(ties.items()):
        log.info("plan: near tie for %s (exposed ms %s): took %s, the first of them in the "
                 "preference order", name, t["tied"], t["took"])  # fmt: skip
    return cur, {
        "objective": "exposed step",
        "sum_plan_exposed_ms": round(before, 6),
        "exposed_ms": round(exposure.total(parts), 6),
        "changed": [names[i] for i in order if cur[i] != members[i]],
        "near_ties": dict(sorted(ties.items())),
        "tolerance": {"rel": tol.rel, "abs_ms": tol.abs_ms},
    }
