"""The cost model: predicted sync time of every strategy, for every K in 1..N.

A strategy is a :class:`Formula`: a table of :class:`Term` (an operation, how many times it
runs, on what size) plus a way to combine them:

- ``"pipeline"`` (CaSync): the terms describe ONE of K partitions of ``m/K`` elements; compute
  terms run on the device, communication terms on the network, and partitions are pipelined::

      T(K) = C + W + (K-1) * (max(C, W) + (1 - overlap) * min(C, W))

  with C, W the per-partition compute and communication times (``overlap`` from the profile).
- ``"sum"`` (the original SeCoPa): the terms already describe the whole tensor, ``T = sum``.

:data:`CASYNC_FORMULAS` are the strategies CaSync runs; :data:`ORIGINAL_FORMULAS` are the
original system's PS and Ring formulas (docs/explanation/secopa.md) written as one
configuration of the same evaluator, so ``CostModel(profile, N, ORIGINAL_FORMULAS)`` reproduces
them exactly when the profile holds the original's affine-with-floor fits.

Sizes are continuous (``m/K``, ``m/(K N)``) so the model is smooth in the tensor size.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from hipress.core.plan import Strategy
from hipress.secopa.model.formulas import CASYNC_FORMULAS, ORIGINAL_FORMULAS, Dims, Formula, Term
from hipress.secopa.model.profile import Profile, ProfileError

__all__ = [
    "CASYNC_FORMULAS",
    "ORIGINAL_FORMULAS",
    "Choice",
    "CostModel",
    "Dims",
    "Formula",
    "Member",
    "Term",
]

Array = NDArray[np.float64]


@dataclass(frozen=True)
class Choice:
    """The best (formula, K) for one tensor: its name, strategy, K and predicted ms."""

    name: str
    strategy: Strategy | None
    compressed: bool
    k: int
    ms: float


class CostModel:
    """Predicts sync times from a :class:`Profile` at world size N (any N >= 1).

    Args:
        profile: the costs.
        world_size: N.
        formulas: the strategy table (default :data:`CASYNC_FORMULAS`).
        max_partitions: cap on K (default N); K also never exceeds the element count.

    Every method is a pure function of the constructor arguments (deterministic).
    """

    def __init__(
        self,
        profile: Profile,
        world_size: int,
        formulas: Sequence[Formula] = CASYNC_FORMULAS,
        max_partitions: int | None = None,
    ) -> None:
        if world_size < 1:
            raise ValueError(f"world size must be >= 1, got {world_size}")
        if max_partitions is not None and max_partitions < 1:
            raise ValueError(f"max_partitions must be >= 1, got {max_partitions}")
        names = [f.name for f in formulas]
        if len(set(names)) != len(names):
            raise ValueError(f"formula names must be unique: {names}")
        for f in formulas:
            for t in f.compute:
                if not profile.has_compute(t.op):
                    raise ProfileError(f"formula {f.name} needs compute cost {t.op!r}")
            for t in f.comm:
                profile.comm_op(t.op)  # raises if missing
        self.profile = profile
        self.n = world_size
        self.formulas = {f.name: f for f in formulas}
        self.kmax = min(world_size, max_partitions or world_size)
        self._partitions: dict[tuple[str, int, int], tuple[list[float], list[float]]] = {}

    def formula(self, name: str) -> Formula:
        try:
            return self.formulas[name]
        except KeyError:
            raise ValueError(f"no formula {name!r} (have {sorted(self.formulas)})") from None

    def _dims(self, m: float, ks: ArrayLike | None) -> Dims:
        k = np.arange(1, self.kmax + 1, dtype=np.float64) if ks is None else np.asarray(ks, float)
        return Dims(self.n, float(m), np.atleast_1d(k), self.profile.payload)

    def _parts(self, f: Formula, d: Dims, latency: bool) -> tuple[Array, Array]:
        """(compute, comm) ms of the formula's terms, per K; comm without latency if asked."""
        c = np.zeros_like(d.k)
        for t in f.compute:
            c = c + self.compute_term(t, d)
        w = np.zeros_like(d.k)
        # CaSync's own cost per collective call (the profile's calibration; 0 if not measured)
        call = self.profile.call_ms if latency and f.combine == "pipeline" else 0.0
        for t in f.comm:
            op = self.profile.comm_op(t.op)
            size = np.broadcast_to(np.asarray(t.size(d), dtype=np.float64), d.k.shape)
            one = op.time(size, self.n) + call if latency else op.slopes(self.n)[0] * size
            w = w + np.asarray(t.count(d)) * one
        return c, w

    def compute_term(self, t: Term, d: Dims) -> Array:
        """ms of a compute term: ``count`` runs on ``size``; for ``pieces`` of one region, at
        least one run over the whole region (:class:`~hipress.secopa.model.formulas.Term`)."""
        count = np.asarray(t.count(d), dtype=np.float64)
        ms = count * self.profile.compute_ms(t.op, t.size(d))
        if t.pieces:
            ms = np.maximum(ms, self.profile.compute_ms(t.op, count * np.asarray(t.size(d))))
        return ms

    def times(self, name: str, m: float, ks: ArrayLike | None = None) -> Array:
        """Predicted ms of formula ``name`` for m elements at each K (default K = 1..kmax).

        Infeasible K (a partition smaller than the formula's ``min_part``) gets ``inf``.
        """
        f = self.formula(name)
        d = self._dims(m, ks)
        c, w = self._parts(f, d, latency=True)
        if f.combine == "sum":
            t = c + w
        else:
            ov = self.profile.overlap
            t = c + w + (d.k - 1) * (np.maximum(c, w) + (1 - ov) * np.minimum(c, w))
        feasible = np.floor(d.m / d.k) >= f.min_part(self.n)
        return np.where(feasible, t, np.inf)

    def time(self, name: str, m: float, k: int = 1) -> float:
        """Predicted ms of formula ``name`` for m elements in k partitions."""
        return float(self.times(name, m, [k])[0])

    def parts(self, name: str, m: float, k: int = 1) -> tuple[float, float]:
        """(compute ms, communication ms) of formula ``name``'s terms for m elements in k
        partitions, latency included: one partition's for a pipelined formula, the whole
        tensor's for a summed one (whose :meth:`time` is their sum)."""
        c, w = self._parts(self.formula(name), self._dims(m, [k]), latency=True)
        return float(c[0]), float(w[0])

    def table(self, m: float) -> dict[str, Array]:
        """Every formula's predicted ms for m elements, for K = 1..kmax."""
        return {name: self.times(name, m) for name in self.formulas}

    def wire_ms(
        self, name: str, m: float, ks: ArrayLike | None = None, bound: str = "max"
    ) -> Array:
        """The bandwidth part of a formula's time (d time / d beta-scale), per K.

        ``bound="max"`` bounds it from above over the collectives' algorithms, ``"min"`` from
        below. For pipelined formulas this is the total over all K partitions.
        """
        f = self.formula(name)
        d = self._dims(m, ks)
        idx = 1 if bound == "max" else 0
        w = np.zeros_like(d.k)
        for t in f.comm:
            slope = self.profile.comm_op(t.op).slopes(self.n)[idx]
            w = w + np.asarray(t.count(d)) * slope * np.asarray(t.size(d))
        return w * d.k if f.combine == "pipeline" else w

    def best(
        self,
        m: float,
        compressed: bool,
        *,
        strategies: Collection[Strategy] | None = None,
        ks: Sequence[int] | None = None,
        wire_limit_ms: float | None = None,
    ) -> Choice | None:
        """The fastest (formula, K) for m elements among compressed (or plain) formulas.

        Args:
            strategies: consider only formulas run by one of these CaSync strategies
                (default: every formula that has a strategy).
            ks: candidate K values (default 1..kmax).
            wire_limit_ms: if given, skip (formula, K) whose bandwidth time (upper bound) is
                not below this.
        Returns the choice (ties: table order, then smallest K), or None if nothing qualifies.
        """
        best: Choice | None = None
        cand = np.arange(1, self.kmax + 1) if ks is None else np.asarray(ks)
        for f in self.formulas.values():
            if f.compressed != compressed or f.strategy is None:
                continue
            if strategies is not None and f.strategy not in strategies:
                continue
            t = self.times(f.name, m, cand)
            if wire_limit_ms is not None:
                t = np.where(self.wire_ms(f.name, m, cand) < wire_limit_ms, t, np.inf)
            i = int(np.argmin(t))
            if np.isfinite(t[i]) and (best is None or t[i] < best.ms):
                best = Choice(f.name, f.strategy, f.compressed, int(cand[i]), float(t[i]))
        return best

    def marginal_ms(self, name: str, m: float) -> float:
        """Marginal ms of adding m elements to a batched round of formula ``name`` (K = 1).

        Compute is paid in full; communication only its bandwidth part at the cheapest
        per-byte rate (the round's collectives, and their latency, are shared). Because the
        collectives' costs are concave in size, this never exceeds the real increase.
        """
        c, w = self._parts(self.formula(name), self._dims(m, [1]), latency=False)
        return float(c[0] + w[0])

    def pipeline_ms(self, rounds: Sequence[tuple[float, float]]) -> float:
        """Time of a sequence of pipelined rounds ``(compute ms, comm ms)``.

        ``(1 - overlap) * sum(C + W) + overlap * F2`` where F2 is the two-machine flow-shop
        makespan ``max_j (C_1 + .. + C_j + W_j + .. + W_R)`` (compute on the device, then the
        wire). For K identical rounds this is exactly :meth:`times`' formula; it is
        subadditive, so batching rounds never predicts more than running them apart.
        """
        if not rounds:
            return 0.0
        c = np.array([r[0] for r in rounds], dtype=np.float64)
        w = np.array([r[1] for r in rounds], dtype=np.float64)
        serial = float(c.sum() + w.sum())
        f2 = float(np.max(np.cumsum(c) + np.cumsum(w[::-1])[::-1]))
        ov = self.profile.overlap
        return (1 - ov) * serial + ov * f2

    def bucket_ms(self, members: Sequence[Member]) -> float:
        """Predicted ms of one DDP bucket as CaSync runs it: :meth:`pipeline_ms` of
        :meth:`bucket_rounds`."""
        return self.pipeline_ms(self.bucket_rounds(members))

    def bucket_rounds(self, members: Sequence[Member]) -> list[tuple[float, float]]:
        """The rounds ``(compute ms, comm ms)`` CaSync issues for one DDP bucket.

        Each pipelined formula's members are batched into rounds: round r carries partition r
        of every member with more than r partitions, its compute is the members' and each of its
        collectives runs once on the concatenated sizes. Rounds go in table order (allreduce,
        allgather rounds, PS rounds) and are pipelined (:meth:`pipeline_ms`). Members of
        ``"sum"`` formulas count as one standalone round each, as do members priced outside
        the table (``fixed``: a row-sparse tensor's own collectives), first.
        """
        rounds: list[tuple[float, float]] = [x.fixed for x in members if x.fixed is not None]
        for f in self.formulas.values():
            mine = [x for x in members if x.formula == f.name and x.fixed is None]
            if not mine:
                continue
            if f.combine == "sum":
                rounds += [(0.0, self.time(f.name, x.numel, x.k)) for x in mine]
                continue
            # each member's partition (all of its partitions are alike): compute terms, sizes
            per = [self._partition(f, x) for x in mine]
            for r in range(max(x.k for x in mine)):
                comp, sizes = 0.0, [0.0] * len(f.comm)
                for x, (terms, xs) in zip(mine, per, strict=True):
                    if x.k <= r:
                        continue
                    for v in terms:
                        comp += v
                    for j, v in enumerate(xs):
                        sizes[j] += v
                d0 = self._dims(1.0, [1])
                comm = sum(
                    _scalar(np.asarray(t.count(d0)))
                    * (
                        _scalar(self.profile.comm_op(t.op).time(size, self.n))
                        + self.profile.call_ms
                    )
                    for t, size in zip(f.comm, sizes, strict=True)
                )
                rounds.append((comp, comm))
        return rounds

    def _partition(self, f: Formula, x: Member) -> tuple[list[float], list[float]]:
        """One partition of member ``x`` under formula ``f``: the ms of each compute term and
        the size of each communication term."""
        key = (f.name, x.numel, x.k)
        if key not in self._partitions:
            d = self._dims(x.numel, [x.k])
            terms = [_scalar(self.compute_term(t, d)) for t in f.compute]
            self._partitions[key] = (terms, [_scalar(t.size(d)) for t in f.comm])
        return self._partitions[key]


@dataclass(frozen=True)
class Member:
    """One tensor of a bucket: synchronised by formula ``formula`` in ``k`` partitions, or,
    with ``fixed`` (compute ms, link ms), in collectives of its own priced outside the formula
    table (a row-sparse tensor, :mod:`~hipress.secopa.model.rowcost`; ``formula`` then says
    whether it is compressed)."""

    formula: str
    numel: int
    k: int = 1
    fixed: tuple[float, float] | None = None


def _scalar(x: ArrayLike) -> float:
    return float(np.asarray(x, dtype=np.float64).reshape(-1)[0])
