"""Selection: which tensor sizes a plan compresses, and with which (strategy, K).

CaSync runs each DDP bucket as one allreduce of all its uncompressed tensors plus, per
compressed strategy, pipelined rounds that batch partition r of every compressed tensor of the
bucket ("bulk synchronisation"). :class:`Selector` decides per tensor size, comparing

- *uncompressed*: the tensor's marginal share of its bucket's allreduce (bandwidth only: the
  allreduce and its latency are paid once per bucket anyway), with
- *compressed*: the best (strategy, K) predicted by :class:`~hipress.secopa.model.costmodel.CostModel`
  for the tensor alone, pipelined over K partitions, latency included (as if it had its rounds
  to itself; sharing them only makes it cheaper).

Three rules make the decisions safe and predictable (docs/explanation/secopa.md explains why):

1. *Faster*: compress only if the compressed prediction is strictly below the uncompressed one.
2. *Saves bandwidth*: a compressed (strategy, K) is a candidate only if its bandwidth time
   (upper bound) is below the uncompressed one's (lower bound); so a compressed choice only
   gains from lower bandwidth, and decisions are monotone in bandwidth.
3. *Monotone in size*: a tensor is compressed only if rule 1 holds at its size and at every
   larger size of the model and of a fixed geometric grid up to 2^32 elements.

Two plan-level steps follow the rules (:meth:`Selector.select`): a *bucket pass* that lowers the
size threshold while that makes the bucket totals strictly faster (the rules treat the latency
of the allreduce a bucket keeps for its small tensors as free), and a *guard* that takes
all-compressed when it is predicted strictly faster still. Both only lower the total and keep
"compress exactly the tensors above a size".

Totals model DDP's buckets (:func:`ddp_buckets`) with :meth:`CostModel.bucket_ms`, which charges
every round CaSync issues in full (the allreduce of a bucket's uncompressed tensors, each
batched allgather and PS round), latency included. ``planned <= all_uncompressed`` for the
rules' plan follows from rules 1-2, the subadditivity of the bucket model and the concavity of
the collectives' costs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import numpy as np

from hipress.core.plan import PlanError, Strategy
from hipress.secopa.model.costmodel import Choice, CostModel, Member
from hipress.secopa.model.ddpbuckets import ddp_buckets
from hipress.secopa.model.exposure import Tolerance

__all__ = ["Decision", "Selector", "ddp_buckets", "size_grid"]

GRID_TOP = 1 << 32

log = logging.getLogger(__name__)

NO_TIE = Tolerance(0.0, 0.0)  # close calls decided strictly


@dataclass(frozen=True)
class Decision:
    """The planner's view of one tensor size: both alternatives and whether to compress."""

    numel: int
    uncompressed: Choice
    uncompressed_ms: float  # marginal share of the bucket's allreduce
    compressed: Choice | None  # best candidate passing rule 2
    faster: bool  # rule 1 at this size


def size_grid(lo: int, per_octave: int, top: int = GRID_TOP) -> list[int]:
    """The fixed geometric grid ``round(2^(j/per_octave))`` restricted to ``[lo, top]``."""
    js = np.arange(0, int(np.log2(top)) * per_octave + 1)
    pts = np.unique(np.round(2.0 ** (js / per_octave)).astype(np.int64))
    return [int(p) for p in pts if lo <= p <= top]


class Selector:
    """Chooses the compressed sizes for one cost model and DDP bucket layout; decisions are
    cached per size.

    ``strategies`` are the compressed strategies it may choose, ``bucket_cap_mb`` and
    ``first_bucket_mb`` DDP's bucket caps, ``grid_per_octave`` the density of rule 3's size
    grid, ``tie`` the guard's tie band (:meth:`alone_allowed`; default: none).
    Deterministic: the same arguments and sizes give the same selection.
    """

    def __init__(
        self,
        model: CostModel,
        strategies: tuple[Strategy, ...],
        *,
        bucket_cap_mb: float,
        first_bucket_mb: float,
        grid_per_octave: int,
        tie: Tolerance = NO_TIE,
    ) -> None:
        self.model = model
        self.strategies = strategies
        self.bucket_cap_mb = bucket_cap_mb
        self.first_bucket_mb = first_bucket_mb
        self.grid_per_octave = grid_per_octave
        self.tie = tie
        self._cache: dict[int, Decision] = {}
        self._alone_memo: dict[int, tuple[bool, bool]] = {}

    def decide(self, numel: int) -> Decision:
        """Both alternatives for a tensor of ``numel`` elements and rule 1's verdict."""
        if numel in self._cache:
            return self._cache[numel]
        cm = self.model
        unc = cm.best(numel, False, strategies=(Strategy.ALLREDUCE,), ks=[1])
        if unc is None:
            raise PlanError(f"no uncompressed option for {numel} elements")
        u_ms = cm.marginal_ms(unc.name, numel)
        comp = cm.best(
            numel, True, strategies=self.strategies, wire_limit_ms=self._wire(unc, numel)
        )
        faster = comp is not None and comp.ms < u_ms
        d = Decision(numel, unc, u_ms, comp, faster)
        self._cache[numel] = d
        return d

    def _wire(self, unc: Choice, numel: int) -> float:
        """Rule 2's limit: the uncompressed choice's bandwidth time (lower bound)."""
        return float(self.model.wire_ms(unc.name, numel, [1], bound="min")[0])

    def candidates(self, numel: int) -> list[Choice]:
        """Every compressed (strategy, K) that rule 2 allows for ``numel`` elements (the
        bandwidth-saving ones of :meth:`decide`), in table order then K."""
        cm = self.model
        wire_u = self._wire(self.decide(numel).uncompressed, numel)
        ks = np.arange(1, cm.kmax + 1)
        out = []
        for f in cm.formulas.values():
            if not f.compressed or f.strategy not in self.strategies:
                continue
            t = cm.times(f.name, numel, ks)
            ok = np.isfinite(t) & (cm.wire_ms(f.name, numel, ks) < wire_u)
            out += [Choice(f.name, f.strategy, True, int(k), float(ms))
                    for k, ms, good in zip(ks, t, ok, strict=True) if good]  # fmt: skip
        return out

    def compressed_sizes(self, numels: Sequence[int]) -> set[int]:
        """The sizes (among ``numels``) to compress: rules 1-3."""
        if not numels:
            return set()
        sizes = set(numels) | set(size_grid(min(numels), self.grid_per_octave))
        ok, out = True, set()
        for s in sorted(sizes, reverse=True):
            ok = ok and self.decide(s).faster
            if ok and s in numels:
                out.add(s)
        return out

    def bucket_total(self, numels: Sequence[int], pick: Callable[[int], Member]) -> float:
        """Predicted ms summed over DDP's buckets; ``pick(i)`` says how tensor i runs."""
        buckets = ddp_buckets(numels, self.bucket_cap_mb, self.first_bucket_mb)
        return sum(self.model.bucket_ms([pick(i) for i in b]) for b in buckets)

    def _assignment(self, numels: Sequence[int], sizes: set[int]) -> dict[int, Choice]:
        """Compress exactly ``sizes``, each with its rule-2 candidate (bandwidth-saving)."""
        out = {}
        for s in sizes:
            c = self.decide(s).compressed
            if c is not None:
                out[s] = c
        return out

    def all_compressed(self, numels: Sequence[int]) -> dict[int, Choice]:
        """Every size with its best compressed (strategy, K), bandwidth-saving or not."""
        out = {}
        for s in sorted(set(numels)):
            c = self.model.best(s, True, strategies=self.strategies)
            if c is not None:
                out[s] = c
        return out

    def assigned_total(
        self, numels: Sequence[int], assign: dict[int, Choice], plain: Collection[int] = ()
    ) -> float:
        """Predicted ms over DDP's buckets when the sizes in ``assign`` are compressed as it
        says and every other tensor (and every index in ``plain``) goes into its bucket's
        allreduce. Every round CaSync issues is charged in full, latency included
        (:meth:`CostModel.bucket_ms`)."""

        def pick(i: int) -> Member:
            c = None if i in plain else assign.get(numels[i])
            if c is None:
                return Member(self.decide(numels[i]).uncompressed.name, numels[i], 1)
            return Member(c.name, numels[i], c.k)

        return self.bucket_total(numels, pick)

    def _alone(self, numel: int) -> tuple[bool, bool]:
        """``(allowed, close)`` for a tensor of ``numel`` elements alone, latency included on
        both sides: its best compressed choice is not slower than its own allreduce by more
        than the tie band of the allreduce's time (:meth:`Tolerance.band`); ``close``: allowed, but
        only by the band (not faster)."""
        if numel not in self._alone_memo:
            c = self.model.best(numel, True, strategies=self.strategies)
            u = self.model.time(self.decide(numel).uncompressed.name, numel)
            band = self.tie.band(u)
            ok = c is not None and c.ms <= u + band
            self._alone_memo[numel] = (ok, c is not None and u <= c.ms <= u + band)
        return self._alone_memo[numel]

    def alone_allowed(self, numel: int) -> bool:
        """Whether a tensor of ``numel`` elements alone is predicted no slower with its best
        compressed choice than with its own allreduce, beyond the tie band (a close call
        does not block the guard: measured latencies of small collectives differ by more
        than that from launch to launch)."""
        return self._alone(numel)[0]

    def _guard_allowed(self, numels: Sequence[int], smallest: int) -> tuple[bool, list[int]]:
        """Whether the guard may compress every size >= ``smallest`` (compression alone
        allowed at each of them and at every larger size of the fixed grid, as rule 3: without
        this, a tiny tensor could be compressed for an all_gather's lower latency while a
        larger one is not, and plans would not be monotone in size), and the sizes that
        were close calls."""
        if smallest < 1:
            return False, []
        grid = set(size_grid(smallest, self.grid_per_octave))
        sizes = sorted({s for s in numels if s >= smallest} | grid, reverse=True)
        ok = all(self.alone_allowed(s) for s in sizes)
        return ok, [s for s in sizes if ok and self._alone(s)[1]]

    def select(
        self, numels: Sequence[int], plain: Collection[int] = ()
    ) -> tuple[dict[int, Choice], dict[str, object]]:
        """The compressed sizes of the plan and how they were chosen; the tensors at the
        indices in ``plain`` stay plain whatever their size (they are priced in their buckets'
        allreduce, and the rules judge the others' sizes).

        1. Rules 1-3 per size give a threshold T0 (:meth:`compressed_sizes`).
        2. *Bucket pass*: the per-size rule charges an uncompressed tensor only its bandwidth
           share of the bucket's allreduce, but a bucket that keeps any uncompressed tensor pays
           that allreduce's latency (and its round in the pipeline). If T0 compressed anything,
           the pass also tries each lower threshold (every model size below T0 down to the
           first size with no bandwidth-saving candidate, rule 2) and keeps the one with the
           lowest predicted total, over DDP's buckets with every round charged; a lower
           threshold must be strictly faster (ties keep fewer tensors compressed).
        3. *Guard*: compressing every tensor from a threshold T up, each with its best
           compressed choice, for every model size T from which compression alone is not
           slower beyond the tie band (latency included) at each size up the grid, as rule 3
           asks (:meth:`alone_allowed`; the sizes allowed only by the band are recorded as
           ``guard_close_calls`` and logged when the guard's plan is taken); the fastest of these
           becomes the plan if it is predicted strictly faster (``all-compressed guard`` when
           T is the smallest size, else ``threshold guard``). Where all-compressed would still
           be faster but its smallest sizes are not allowed, the record says
           ``guard_blocked`` (all-compressed wins through a tiny tensor's all_gather latency
           while a larger tensor alone would not gain: monotonicity in size is kept instead).
           The per-size rules charge an uncompressed tensor the cheapest per-byte rate of its
           collective, which on loopback (cache-resident small messages) can be half of what a
           large bucket costs; the guard judges every threshold on the bucket totals.
           All-uncompressed can never be faster (see the module docstring).

        Every plan considered compresses exactly the tensors above a size, so the result is
        monotone in size. Returns ``(size -> choice, selection record)``.
        """
        free = [k for i, k in enumerate(numels) if i not in plain]

        def total(a: dict[int, Choice]) -> float:
            return self.assigned_total(numels, a, plain)

        sizes = sorted(set(free), reverse=True)
        chosen = self.compressed_sizes(free)
        assign = self._assignment(free, chosen)
        rules_ms = best_ms = total(assign)
        how = "per-tensor rules"
        threshold = min(chosen) if chosen else None
        if chosen:
            trial = dict(assign)
            for s in sizes:
                if s >= min(chosen):
                    continue
                c = self.decide(s).compressed
                if c is None:
                    break
                trial[s] = c
                ms = total(trial)
                if ms < best_ms:
                    assign, best_ms, threshold, how = dict(trial), ms, s, "bucket pass"
        every = self.all_compressed(free)
        every_ms = total(every)
        guard, close, tied = self._guard(free, total, every, every_ms, best_ms)
        if guard is not None:
            threshold, best_ms, assign = guard
            how = "all-compressed guard" if threshold == min(every) else "threshold guard"
            if close:
                log.info("plan: %s: compression alone is within the tie band of plain (not "
                         "faster) at %d grid size(s) from %d elements up: close calls, not "
                         "blocking", how, len(close), min(close))  # fmt: skip
            if len(tied) > 1:
                log.info("plan: %s: thresholds %s are within the tie band of the fastest "
                         "total: took the smallest", how, tied)  # fmt: skip
        record: dict[str, object] = {
            "how": how,
            "threshold": threshold,
            "guard_blocked": every_ms < best_ms,
            "guard_close_calls": close,
            "guard_ties": tied if len(tied) > 1 else [],
            "per_tensor_rules_ms": round(rules_ms, 6),
            "planned_ms": round(best_ms, 6),
        }
        return assign, record

    def _guard(
        self, free: Sequence[int], total: Callable[[dict[int, Choice]], float],
        every: dict[int, Choice], every_ms: float, best_ms: float,
    ) -> tuple[tuple[int, float, dict[int, Choice]] | None, list[int], list[int]]:  # fmt: skip
        """The guard of :meth:`select` over the sizes ``free`` may compress: every size from
        a threshold up with its best compressed choice (``every``, whose ``total`` is
        ``every_ms``), for each threshold rule 3 allows with latency (:meth:`_guard_allowed`:
        a suffix of the sizes), when strictly faster than ``best_ms``. Thresholds within the
        tie band of the fastest total are tied and the smallest (the fewest bytes) is taken,
        so that a hair's difference between the totals measured in two launches does not
        change the plan. Returns ``((threshold, total, assignment) or None, close-call sizes,
        tied thresholds)``."""
        guards = []
        for s in sorted(every):
            allowed, close = self._guard_allowed(free, s)
            if allowed:
                trial = {x: c for x, c in every.items() if x >= s}
                ms = every_ms if s == min(every) else total(trial)
                guards.append((s, ms, trial, close))
        if not guards:
            return None, [], []
        top = min(g[1] for g in guards)
        near = [g for g in guards if g[1] <= top + self.tie.band(top) and g[1] < best_ms]
        if not near:
            return None, [], []
        s, ms, trial, close = near[0]
        return (s, ms, trial), sorted(close), [g[0] for g in near]
