"""SeCoPa's plan for a multi-round algorithm (PowerSGD): per tensor, its rounds, plain, or
exact rows, from measured costs (``plan="auto"`` with a multi-round algorithm).

Each tensor is priced alone (:func:`~hipress.secopa.model.rounds.price_rounds`): its rounds
(each round's all-reduce at the world size, plus the measured encodes and decode of its
shape, plus CaSync's cost per call for each collective) against the plain all-reduce of its
float32 bytes (one call). The rounds of one tensor depend on each other, so the sum is the
tensor's time; other buckets overlap it, which a per-tensor choice does not change. A tensor
runs its rounds when they are faster than plain by more than the tie margin,
``max(tie_abs_ms, tie_rel * plain)``; within it, the tensor stays plain (the exact choice, as
the single-round planner keeps fewer tensors compressed on a tie), and the close call is
logged and recorded in ``meta["close_calls"]``.

Tensors the :class:`~hipress.core.rule.Selection` keeps plain by ``exclude``/``shapes`` stay
plain, as do tensors under two dimensions (the rounds need a 2-D view). A 2-D embedding is
also priced as exact rows (:func:`~hipress.secopa.model.rowcost.breakeven` against the faster
of its rounds and plain): it starts plain, CaSync counts its touched rows in the first step,
and :func:`~hipress.codec.rowplan.plan_rows` then sends it as rows when the count is within
the break-even recorded in ``meta["row_prices"]``, else as ``meta["embedding_dense"]`` says.

Same inputs, same plan: nothing here measures or draws at random.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hipress.compll.rounds import RoundsAlgorithm
from hipress.core.plan import Plan, PlanError, Strategy, TensorPlan
from hipress.core.rule import Selection
from hipress.secopa.model.costfn import AffineFloor, CostFn
from hipress.secopa.model.costmodel import CostModel
from hipress.secopa.model.network import CommOp
from hipress.secopa.model.profile import COLLECTIVES, PayloadModel, Profile
from hipress.secopa.model.rounds import RoundsCost, price_rounds
from hipress.secopa.model.rowcost import breakeven

__all__ = ["RoundsProfile", "plan_rounds"]

log = logging.getLogger(__name__)

Shape = tuple[int, ...]


@dataclass(frozen=True)
class RoundsProfile:
    """The costs :func:`plan_rounds` plans with.

    Fields:
        network: the four collectives (SeCoPa comm ops), e.g. measured by
            :func:`~hipress.secopa.measure.netprofiler.measure_network`.
        compute_ms: each 2-D (or more) shape's encodes and decode together, in ms
            (:func:`~hipress.secopa.model.rounds.measure_compute_ms`).
        merge: the cost (ms) of one float32 read-write pass over n elements (exact rows'
            scan, gather and scatter).
        call_ms: CaSync's fixed cost per collective call (ms, >= 0).
        meta: provenance, copied into the plan's ``meta["profile"]``.
    """

    network: Mapping[str, CommOp]
    compute_ms: Mapping[Shape, float]
    merge: CostFn = field(default_factory=lambda: AffineFloor(0.0, 0.0))
    call_ms: float = 0.0
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        missing = [op for op in COLLECTIVES if op not in self.network]
        if missing:
            raise PlanError(f"the network lacks {missing}")
        if not self.call_ms >= 0:
            raise PlanError(f"call_ms must be >= 0, got {self.call_ms}")
        bad = {s: v for s, v in self.compute_ms.items() if not v >= 0}
        if bad:
            raise PlanError(f"compute_ms must be >= 0 ms, got {bad}")

    def rows_model(self, alg: RoundsAlgorithm, world_size: int) -> CostModel:
        """The cost model exact rows are priced with (only ``merge`` and the link count)."""
        compute = {"encode": self.merge, "decode": self.merge, "merge": self.merge}
        profile = Profile(alg.name, dict(alg.params), PayloadModel(4.0, 0.0), compute,
                          dict(self.network), call_ms=self.call_ms)  # fmt: skip
        return CostModel(profile, world_size)


@dataclass(frozen=True)
class _Choice:
    rounds: bool
    cost: RoundsCost | None
    why: str | None  # why plain, else None
    close: bool = False


def _price(alg: RoundsAlgorithm, shape: Shape, world: int, prof: RoundsProfile) -> RoundsCost:
    if shape not in prof.compute_ms:
        raise PlanError(f"no measured encode/decode cost for shape {list(shape)}")
    cost = price_rounds(alg, shape, world, prof.network, prof.compute_ms[shape])
    call = prof.call_ms
    rounds = tuple(r + call for r in cost.rounds_ms)
    return RoundsCost(rounds, cost.compute_ms, cost.plain_ms + call)


def _choose(alg: RoundsAlgorithm, name: str, shape: Shape, world: int, prof: RoundsProfile,
            select: Selection, tie: tuple[float, float]) -> _Choice:  # fmt: skip
    why = select.reason(name, shape, implicit=False)
    if why is not None:
        return _Choice(False, None, why)
    if len(shape) < 2:
        return _Choice(False, None, f"{len(shape)}-D")
    cost = _price(alg, shape, world, prof)
    margin = max(tie[1], tie[0] * cost.plain_ms)
    diff = cost.plain_ms - cost.total_ms
    if diff > margin:
        return _Choice(True, cost, None)
    close = abs(diff) <= margin
    why = "a close call: kept plain" if close else "plain is faster"
    return _Choice(False, cost, why, close)


def _record(cost: RoundsCost, rounds: bool) -> dict[str, Any]:
    return {"rounds_ms": [round(r, 6) for r in cost.rounds_ms],
            "compute_ms": round(cost.compute_ms, 6), "total_ms": round(cost.total_ms, 6),
            "plain_ms": round(cost.plain_ms, 6), "speedup": round(cost.speedup, 4),
            "chosen": "rounds" if rounds else "plain"}  # fmt: skip


def plan_rounds(
    alg: RoundsAlgorithm,
    named: Sequence[tuple[str, Shape]],
    world_size: int,
    profile: RoundsProfile,
    selection: Selection | None = None,
    *,
    tie_rel: float = 0.03,
    tie_abs_ms: float = 0.1,
) -> Plan:
    """The plan of ``alg`` for the parameters ``named`` (``(name, shape)``, in order) at
    ``world_size`` (see the module docstring). Raises :class:`PlanError` for a world size
    under 1, a negative tie margin or a shape with no measured cost."""
    if world_size < 1:
        raise PlanError(f"world_size must be >= 1, got {world_size}")
    if not (tie_rel >= 0 and tie_abs_ms >= 0):
        raise PlanError(f"tie_rel and tie_abs_ms must be >= 0, got {tie_rel}, {tie_abs_ms}")
    select = selection or Selection()
    entries, kept, prices, close = [], {}, {}, {}
    embeddings, dense, row_prices = [], {}, {}
    rows_model = None
    for name, shape in named:
        numel = _numel(shape)
        c = _choose(alg, name, tuple(shape), world_size, profile, select, (tie_rel, tie_abs_ms))
        plain_ms = c.cost.plain_ms if c.cost else _plain_ms(numel, world_size, profile)
        ms = c.cost.total_ms if c.cost and c.rounds else plain_ms
        if c.cost is not None:
            prices[name] = _record(c.cost, c.rounds)
        if c.close:
            assert c.cost is not None
            close[name] = prices[name]
            log.info("plan: %s: rounds %.3f ms vs plain %.3f ms: a close call, kept plain",
                     name, c.cost.total_ms, c.cost.plain_ms)  # fmt: skip
        rounds = c.rounds
        if c.cost is not None and len(shape) == 2 and select.is_embedding(name, shape):
            rows_model = rows_model or profile.rows_model(alg, world_size)
            be = breakeven(rows_model, numel, shape[0], ms, compressed=False)
            row_prices[name] = {"rows": shape[0], "compressed": False, "dense_ms": round(ms, 6),
                                "breakeven": be,
                                "chosen": "rows if at most breakeven rows are touched"}  # fmt: skip
            if be >= 0:  # plain in the first step, its rows counted
                embeddings.append(name)
                dense[name] = "rounds" if rounds else "plain"
                rounds, kept[name] = False, "embedding (rows counted in the first step)"
        if not rounds and name not in kept:
            kept[name] = c.why or "plain"
        strategy = Strategy.ROUNDS if rounds else Strategy.ALLREDUCE
        entries.append(TensorPlan(name, numel, rounds, strategy, predicted_ms=round(ms, 6),
                                  uncompressed_ms=round(plain_ms, 6)))  # fmt: skip
    meta = {"planner": "rounds-auto", "rounds": list(alg.rounds), "kept_plain": kept,
            "embeddings": embeddings, "embedding_dense": dense, "rounds_prices": prices,
            "close_calls": close, "tie": {"rel": tie_rel, "abs_ms": tie_abs_ms},
            "profile": dict(profile.meta)}  # fmt: skip
    if row_prices:
        meta["row_prices"] = row_prices
    totals = {"planned": _sum(e.predicted_ms for e in entries),
              "all_uncompressed": _sum(e.uncompressed_ms for e in entries)}  # fmt: skip
    return Plan(alg.name, dict(alg.params), world_size, tuple(entries), totals, meta)


def _plain_ms(numel: int, world: int, prof: RoundsProfile) -> float:
    return float(prof.network["allreduce"].time(4 * numel, world)) + prof.call_ms


def _numel(shape: Shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _sum(xs: Any) -> float:
    return round(float(sum(xs)), 6)
