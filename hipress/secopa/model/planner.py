"""The planner: (parameter name, element count) pairs + a profile -> a :class:`Plan`.

Which sizes to compress, and how, is :mod:`~hipress.secopa.model.selection`'s: per-size rules, a
bucket pass and a guard, all of which keep "compress exactly the tensors above a size" (the
rules and why they are safe: its docstring and docs/explanation/secopa.md). This module
assembles the plan from that selection: one :class:`TensorPlan` per parameter, in order, the
totals (``planned``, ``all_uncompressed``, ``all_compressed``, each summed over DDP's buckets
with every round CaSync issues charged in full), the selection record and the planner's
settings and network provenance in ``meta``. :class:`Planner` also predicts any plan for the
same parameters and builds the all-uncompressed and all-compressed baselines.

When the profile holds the gradients' ready times, each compressed tensor's (strategy, K) is
then chosen by the exposed time of the whole step (:mod:`~hipress.secopa.model.exposure`):
``totals["exposed"]`` and ``meta["exposure"]`` record it, near ties included. Without them
(``PlannerConfig.objective="sum"``, or a profile measured without a training step) the plan is
the sum-of-costs plan, and the planner logs that it plans without ready times.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hipress.core.plan import Plan, PlanError, Strategy, TensorPlan
from hipress.secopa.model.costmodel import CASYNC_FORMULAS, Choice, CostModel, Formula, Member
from hipress.secopa.model.ddpbuckets import ready_buckets
from hipress.secopa.model.exposure import Exposure, Tolerance, preference, refine
from hipress.secopa.model.profile import AlphaBeta, MeasuredComm, Profile
from hipress.secopa.model.rowcost import RowDensity, choose_rows, price_rows
from hipress.secopa.model.rowexposure import rows_by_exposure
from hipress.secopa.model.selection import Decision, Selector, ddp_buckets

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlannerConfig:
    """Planner settings (all validated eagerly).

    Fields:
        bucket_cap_mb: DDP ``bucket_cap_mb``.
        first_bucket_mb: DDP's first (smallest) bucket, 1 MiB in torch.
        max_partitions: cap on K (default: the world size).
        strategies: compressed strategies the planner may choose.
        formulas: the cost model's strategy table.
        grid_per_octave: density of the size grid of rule 3.
        objective: ``"auto"`` (the exposed step time when the profile has ready times, else
            the sum of per-tensor costs), ``"exposed"`` (needs ready times) or ``"sum"``.
        tie_rel, tie_abs_ms: with the exposed objective, a tensor's choices within
            ``max(tie_abs_ms, tie_rel * its own predicted time)`` of the best are tied and the
            preferred one is taken (:class:`~hipress.secopa.model.exposure.Tolerance`); with
            either objective, compression alone within that band of plain does not block the
            selection's guard (:meth:`Selector.alone_allowed`).
    """

    bucket_cap_mb: float = 25.0
    first_bucket_mb: float = 1.0
    max_partitions: int | None = None
    # the ring is opt-in: `hipress bench plan` measured its plans slower than predicted
    # (docs/explanation/secopa.md), where its hops compete for the CPU with the hook's own rounds
    strategies: tuple[Strategy, ...] = (Strategy.ALLGATHER, Strategy.PS)
    formulas: tuple[Formula, ...] = field(default=CASYNC_FORMULAS, repr=False)
    grid_per_octave: int = 8
    objective: str = "auto"
    tie_rel: float = 0.03
    tie_abs_ms: float = 0.1

    def __post_init__(self) -> None:
        if not (self.bucket_cap_mb > 0 and self.first_bucket_mb > 0):
            raise PlanError("bucket sizes must be positive")
        if self.max_partitions is not None and self.max_partitions < 1:
            raise PlanError(f"max_partitions must be >= 1, got {self.max_partitions}")
        if Strategy.ALLREDUCE in self.strategies:
            raise PlanError("strategies lists compressed strategies; ALLREDUCE is always allowed")
        if self.grid_per_octave < 1:
            raise PlanError("grid_per_octave must be >= 1")
        if self.objective not in ("auto", "exposed", "sum"):
            raise PlanError(f"objective is auto, exposed or sum, not {self.objective!r}")
        if not (self.tie_rel >= 0 and self.tie_abs_ms >= 0):
            raise PlanError("tie_rel and tie_abs_ms must be >= 0")


class Planner:
    """Plans for one profile, world size and config; decisions are cached per size.

    Deterministic: the same (profile, world size, config, parameters) give the same plan.
    """

    def __init__(
        self, profile: Profile, world_size: int, config: PlannerConfig | None = None
    ) -> None:
        self.profile = profile
        self.config = config or PlannerConfig()
        self.world_size = world_size
        self.model = CostModel(
            profile, world_size, self.config.formulas, self.config.max_partitions
        )
        unc = [
            f for f in self.config.formulas if not f.compressed and f.strategy is Strategy.ALLREDUCE
        ]
        if not unc:
            raise PlanError("the formula table has no uncompressed ALLREDUCE formula")
        self.plain = unc[0].name
        cfg = self.config
        self.selector = Selector(
            self.model,
            cfg.strategies,
            bucket_cap_mb=cfg.bucket_cap_mb,
            first_bucket_mb=cfg.first_bucket_mb,
            grid_per_octave=cfg.grid_per_octave,
            tie=Tolerance(cfg.tie_rel, cfg.tie_abs_ms),
        )

    def at_caps(self, bucket_cap_mb: float, first_bucket_mb: float) -> Planner:
        """This planner for other DDP bucket caps (and the exposed objective), sharing the
        cost model and the per-size decisions, which do not depend on the buckets."""
        other = copy.copy(self)
        other.config = replace(self.config, bucket_cap_mb=bucket_cap_mb,
                               first_bucket_mb=first_bucket_mb, objective="exposed")  # fmt: skip
        other.selector = copy.copy(self.selector)
        other.selector.bucket_cap_mb, other.selector.first_bucket_mb = bucket_cap_mb, first_bucket_mb
        return other

    def decide(self, numel: int) -> Decision:
        """Both alternatives for a tensor of ``numel`` elements and rule 1's verdict
        (:meth:`Selector.decide`)."""
        return self.selector.decide(numel)

    def compressed_sizes(self, numels: Sequence[int]) -> set[int]:
        """The sizes (among ``numels``) to compress by rules 1-3
        (:meth:`Selector.compressed_sizes`)."""
        return self.selector.compressed_sizes(numels)

    def select(
        self, numels: Sequence[int], plain: Collection[int] = ()
    ) -> tuple[dict[int, Choice], dict[str, object]]:
        """``(size -> choice, selection record)``, the tensors at the indices in ``plain``
        kept plain (:meth:`Selector.select`)."""
        return self.selector.select(numels, plain)

    def plan(
        self, named: Sequence[tuple[str, int]], rows: Mapping[str, RowDensity] | None = None,
        plain: Collection[str] = (),
    ) -> Plan:  # fmt: skip
        """The plan for these parameters (in this order). ``rows``: the 2-D gradients that may
        travel as rows (:mod:`~hipress.secopa.model.rowcost`): each is row-sparse where its
        rows' price beats its dense time (``meta["row_prices"]`` says why, with the break-even
        count). ``plain``: parameters that stay uncompressed whatever the costs (a selection's
        exclusions: biases, embeddings); the plan and its totals are made with them plain.
        Raises :class:`PlanError` on duplicate names, non-positive sizes or rows that do not
        fit."""
        names = [n for n, _ in named]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise PlanError(f"duplicate parameter names {dup[:5]}")
        numels = [int(k) for _, k in named]
        bad = [n for n, k in named if int(k) < 1]
        if bad:
            raise PlanError(f"parameters with no elements: {bad[:5]}")
        fixed = {i for i, n in enumerate(names) if n in plain}
        assign, record = self.select(numels, fixed)
        members = [self._member(k, None if i in fixed else assign.get(k))
                   for i, k in enumerate(numels)]  # fmt: skip
        meta = self.meta()
        meta["selection"] = record
        exposed = self._exposed()
        if rows:
            dense, gather = members, self.formula_for(Strategy.ALLGATHER)
            members, prices = choose_rows(self.model, names, members, rows, self.plain, gather)
            meta["row_prices"] = prices
            if exposed:  # row-sparse where that lowers the step's exposed time
                members = rows_by_exposure(
                    self.exposure(names, numels), self.model, names, dense, members, rows,
                    prices, (self.plain, gather), self.selector.tie,
                )  # fmt: skip
        extra: dict[str, float] = {}
        if exposed:
            members, meta["exposure"] = self.refine(names, members)
            extra["exposed"] = float(meta["exposure"]["exposed_ms"])  # type: ignore[index]
        entries = []
        prices: Mapping[str, Any] = meta.get("row_prices", {})  # type: ignore[assignment]
        for name, m in zip(names, members, strict=True):
            f = self.model.formula(m.formula)
            u_ms = self.decide(m.numel).uncompressed_ms
            if m.fixed is not None:  # row-sparse
                p = prices[name]
                strategy = f.strategy or Strategy.ALLREDUCE
                entries.append(TensorPlan(name, m.numel, f.compressed, strategy, 1, sum(m.fixed),
                                          u_ms, p["rows"], p["row_bound"]))  # fmt: skip
            elif f.compressed and f.strategy is not None:
                ms = self.model.time(m.formula, m.numel, m.k)
                entries.append(TensorPlan(name, m.numel, True, f.strategy, m.k, ms, u_ms))
            else:
                entries.append(TensorPlan(name, m.numel, False, Strategy.ALLREDUCE, 1, u_ms, u_ms))
        plan = Plan(
            algorithm=self.profile.algorithm,
            params=dict(self.profile.params),
            world_size=self.world_size,
            entries=tuple(entries),
            meta=meta,
        )
        totals = self.totals(numels, assign, fixed)
        if extra or any(m.fixed for m in members):  # the refined (or row-sparse) plan's total
            totals["planned"] = round(self.predict(plan), 6)
        totals.update(extra)
        return replace(plan, totals=totals)

    def _member(self, numel: int, c: Choice | None) -> Member:
        if c is None or c.strategy is None:
            return Member(self.decide(numel).uncompressed.name, numel, 1)
        return Member(c.name, numel, c.k)

    def _exposed(self) -> bool:
        """Whether plans minimise the exposed step time (else the sum of costs); logs why."""
        objective, ready = self.config.objective, self.profile.readiness
        if objective == "exposed" and ready is None:
            raise PlanError(
                "objective='exposed' needs the gradients' ready times in the profile: measure "
                "them (hipress.secopa.measure.readiness) or plan with objective='sum'"
            )
        if objective == "auto" and ready is None:
            log.info("plan: the profile has no gradient ready times; planning by the sum of "
                     "per-tensor costs")  # fmt: skip
        return objective != "sum" and ready is not None

    def refine(
        self, names: Sequence[str], members: Sequence[Member]
    ) -> tuple[list[Member], dict[str, object]]:
        """Each compressed tensor's (strategy, K) by the exposed step time
        (:func:`~hipress.secopa.model.exposure.refine`); needs the profile's ready times."""
        ready = self.profile.readiness
        if ready is None:
            raise PlanError("the profile has no gradient ready times")
        cfg = self.config
        exposure = self.exposure(names, [m.numel for m in members])
        cands: list[list[Choice]] = []
        for m in members:
            if m.fixed is not None or not self.model.formula(m.formula).compressed:
                cands.append([])
                continue
            cs = self.selector.candidates(m.numel)
            if not any((c.name, c.k) == (m.formula, m.k) for c in cs):  # a guard's choice
                f = self.model.formula(m.formula)
                ms = self.model.time(f.name, m.numel, m.k)
                cs.append(Choice(f.name, f.strategy, True, m.k, ms))
            cands.append(cs)
        out, record = refine(
            exposure, names, members, cands, ready, preference(cfg.strategies, self.world_size),
            self.selector.tie,
        )  # fmt: skip
        record["unmeasured"] = sum(n not in ready.leads_ms for n in names)
        return out, record

    def exposure(self, names: Sequence[str], numels: Sequence[int]) -> Exposure:
        """The step's :class:`~hipress.secopa.model.exposure.Exposure` over DDP's buckets as
        it rebuilds them in ready order at this config's caps; needs the profile's ready
        times."""
        ready = self.profile.readiness
        if ready is None:
            raise PlanError("the profile has no gradient ready times")
        leads = [ready.lead(n) for n in names]
        cfg = self.config
        buckets = ready_buckets(numels, leads, cfg.bucket_cap_mb, cfg.first_bucket_mb)
        return Exposure(self.model, names, buckets, ready)

    def exposed(self, plan: Plan) -> float:
        """Predicted exposed ms of a step of any plan for these parameters, at this config's
        bucket caps (needs the profile's ready times)."""
        exposure = self.exposure([e.name for e in plan.entries], [e.numel for e in plan.entries])
        return exposure.of([self.member(plan, i) for i in range(len(plan.entries))])

    def totals(
        self, numels: Sequence[int], assign: dict[int, Choice], plain: Collection[int] = ()
    ) -> dict[str, float]:
        """Predicted ms: ``planned`` (sizes in ``assign`` compressed as it says),
        ``all_uncompressed`` and ``all_compressed`` (every tensor but those at the indices in
        ``plain``)."""
        sel = self.selector
        out = {
            "planned": sel.assigned_total(numels, assign, plain),
            "all_uncompressed": sel.assigned_total(numels, {}),
            "all_compressed": sel.assigned_total(numels, sel.all_compressed(numels), plain),
        }
        return {k: round(v, 6) for k, v in out.items()}

    def formula_for(self, strategy: Strategy) -> str:
        """The formula name that models ``strategy`` in this planner's table."""
        for f in self.config.formulas:
            if f.strategy is strategy and f.compressed == (strategy is not Strategy.ALLREDUCE):
                return f.name
        raise PlanError(f"the formula table has no formula for strategy {strategy.value}")

    def predict(self, plan: Plan) -> float:
        """Predicted ms per step of any plan for these parameters (over DDP's buckets)."""
        numels = [e.numel for e in plan.entries]
        return self.selector.bucket_total(numels, lambda i: self.member(plan, i))

    def member(self, plan: Plan, i: int) -> Member:
        """How entry ``i`` of ``plan`` runs, for the cost model: a row-sparse entry at the
        price ``meta["row_prices"]`` records, else at its bound's (touched = (bound - 1) / 2,
        :func:`~hipress.secopa.model.rowcost.row_bound`'s inverse)."""
        e = plan.entries[i]
        f = self.formula_for(e.strategy)
        if not e.row_bound:
            return Member(f, e.numel, e.partitions)
        rec = dict(plan.meta.get("row_prices", {})).get(e.name, {})
        if "compute_ms" not in rec or rec.get("row_bound") != e.row_bound:
            p = price_rows(self.model, e.numel, e.rows, (e.row_bound - 1) // 2, e.compress)
            rec = {"compute_ms": p.compute_ms, "comm_ms": p.comm_ms}
        return Member(f, e.numel, 1, (float(rec["compute_ms"]), float(rec["comm_ms"])))

    def breakdown(self, plan: Plan) -> dict[str, float]:
        """What :meth:`predict` adds up, per step: ``rounds`` (collective rounds CaSync
        issues), ``compute_ms`` and ``comm_ms`` (their serial sums, before pipelining)."""
        entries, cfg = plan.entries, self.config
        buckets = ddp_buckets([e.numel for e in entries], cfg.bucket_cap_mb, cfg.first_bucket_mb)
        rounds = [r for b in buckets for r in self.model.bucket_rounds(
            [self.member(plan, i) for i in b])]  # fmt: skip
        return {
            "rounds": float(len(rounds)),
            "compute_ms": round(sum(c for c, _ in rounds), 6),
            "comm_ms": round(sum(w for _, w in rounds), 6),
        }

    def baseline(self, named: Sequence[tuple[str, int]], compress: bool) -> Plan:
        """All-uncompressed, or all-compressed (each tensor's best compressed strategy and K;
        a tensor no compressed strategy can run stays uncompressed)."""
        entries = []
        for name, numel in named:
            c = self.model.best(numel, True, strategies=self.config.strategies)
            if compress and c is not None and c.strategy is not None:
                entries.append(TensorPlan(name, numel, True, c.strategy, c.k, c.ms))
            else:
                ms = self.decide(numel).uncompressed.ms
                entries.append(TensorPlan(name, numel, False, Strategy.ALLREDUCE, 1, ms, ms))
        key = "all_compressed" if compress else "all_uncompressed"
        plan = Plan(
            self.profile.algorithm,
            dict(self.profile.params),
            self.world_size,
            tuple(entries),
            meta=self.meta(),
        )
        return Plan(
            plan.algorithm,
            plan.params,
            plan.world_size,
            plan.entries,
            {key: round(self.predict(plan), 6)},
            plan.meta,
        )

    def meta(self) -> dict[str, object]:
        """Planner settings and the network's provenance, for ``Plan.meta``."""
        cfg = self.config
        net = self.profile.meta.get("network_source", {})
        ar = self.profile.network["allreduce"]
        return {
            "planner": {
                "bucket_cap_mb": cfg.bucket_cap_mb,
                "first_bucket_mb": cfg.first_bucket_mb,
                "max_partitions": self.model.kmax,
                "strategies": [s.value for s in cfg.strategies],
                "formulas": [f.name for f in cfg.formulas],
                "objective": "exposed"
                if self.profile.readiness is not None and cfg.objective != "sum"
                else "sum",
            },
            "network": {k: v for k, v in dict(net).items() if k != "samples"},
            "allreduce_alpha_ms": (
                ar.model.alpha_ms
                if isinstance(ar, MeasuredComm)
                else ar.alpha_ms
                if isinstance(ar, AlphaBeta)
                else None
            ),
            "overlap": self.profile.overlap,
        }


def plan_named(
    named: Sequence[tuple[str, int]],
    profile: Profile,
    world_size: int,
    config: PlannerConfig | None = None,
    rows: Mapping[str, RowDensity] | None = None,
    plain: Collection[str] = (),
) -> Plan:
    """Plan ``(name, numel)`` pairs for ``world_size`` workers (see :class:`Planner`);
    ``rows``: the gradients that may travel as rows, ``plain``: the parameters that stay
    uncompressed (:meth:`Planner.plan`)."""
    if world_size < 1:
        raise PlanError(f"world size must be >= 1, got {world_size}")
    return Planner(profile, world_size, config).plan(named, rows, plain)
