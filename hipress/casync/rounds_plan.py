"""Plans of multi-round algorithms (PowerSGD) in CaSync: :func:`resolve`, :func:`make_plan`,
:func:`check_plan`, :func:`decide_rows`.

``register(ddp, "powersgd")`` runs a multi-round algorithm (:mod:`hipress.compll.rounds`)
through the normal CaSync state. Its plan says, per tensor, one of:

- ``strategy: rounds`` (``compress: true``): the tensor runs the algorithm's rounds, each an
  all-reduce of the summed payloads (:class:`~hipress.casync.rounds_hook.RoundsRunner`);
- ``strategy: allreduce`` (``compress: false``): plain, in one all-reduce per bucket;
- ``strategy: allreduce`` with ``row_bound > 0``: exact rows
  (:mod:`hipress.casync.strategies.rowsparse`).

The default split is PyTorch's ``powerSGD_hook``'s (:func:`~hipress.casync.rounds_hook.compresses`:
tensors of two or more dimensions whose rounds send under half their bytes), minus what the
:class:`~hipress.core.rule.Selection` keeps plain by ``exclude``/``shapes``. Embeddings run the
plain (exact) in the first compressed step, which counts their touched rows; from the next
step on they go as exact rows where rows pay (:func:`~hipress.casync.rowprobe.plan_rows`'s
rule), else run the rounds (:func:`decide_rows`).

``plan="auto"`` (:func:`auto_plan`) has SeCoPa choose per tensor from measured costs
(:func:`~hipress.secopa.model.rounds_planner.plan_rounds`): the rounds, plain, or (for
embeddings) exact rows by its break-even count, falling back to what
``meta["embedding_dense"]`` says when the rows are too many.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from hipress.casync.rounds_hook import compresses, shared_rounds
from hipress.casync.rowprobe import plan_rows
from hipress.casync.runtime import rounds_states
from hipress.casync.verdict import replan
from hipress.codec.algorithm import resolve_algorithm
from hipress.codec.errors import CaSyncError
from hipress.codec.logs import RANK_FILTER
from hipress.compll.rounds import RoundsAlgorithm
from hipress.core.plan import Plan, PlanError, Strategy, TensorPlan
from hipress.core.rule import Selection
from hipress.secopa.measure.broadcast import broadcast_plan
from hipress.secopa.measure.comm import TorchComm
from hipress.secopa.measure.netprofiler import (
    DEFAULT_NETWORK_REPS,
    DEFAULT_NETWORK_SIZES,
    measure_network,
    network_meta,
)
from hipress.secopa.model.rounds import measure_compute_ms, measure_merge
from hipress.secopa.model.rounds_planner import RoundsProfile, plan_rounds

__all__ = [
    "auto_plan", "check_options", "check_plan", "decide_rows", "make_plan", "resolve",
    "resolve_any", "row_candidates",
]  # fmt: skip

log = logging.getLogger(__name__)
log.addFilter(RANK_FILTER)

# the smallest payload saving that runs the rounds (PyTorch's min_compression_rate)
MIN_COMPRESSION_RATE = 2.0

Shapes = Mapping[str, tuple[int, ...] | None]


def resolve(algorithm: Any, params: Mapping[str, Any] | None, backend: str) -> RoundsAlgorithm | None:
    """The multi-round algorithm ``algorithm`` names (or is), else None (a single-round one).
    Raises :class:`CaSyncError` for bad parameters."""
    if isinstance(algorithm, RoundsAlgorithm):
        if params:
            raise CaSyncError("params are only accepted with an algorithm name, not an object")
        return algorithm
    if not isinstance(algorithm, str) or algorithm == "none":
        return None
    from hipress.compll.rounds import rounds_algorithms

    if algorithm not in rounds_algorithms():
        return None
    from hipress import compll

    try:
        return shared_rounds(algorithm, backend, params)
    except (compll.CllError, TypeError, ValueError) as exc:
        raise CaSyncError(f"cannot load algorithm {algorithm!r}:\n{exc}") from exc


def check_options(alg: RoundsAlgorithm, plan: Any, fallback: Any, schedule: Any,
                  shapes: Shapes) -> None:  # fmt: skip
    """Refuse, naming the option, what a multi-round algorithm does not support."""
    if schedule:
        raise CaSyncError(f"params_schedule is not supported with the multi-round {alg.name}")
    if fallback is not None and not isinstance(fallback, bool):
        raise CaSyncError(f"fallback must be True, False or None, got {fallback!r}")
    unknown = sorted(n for n, s in shapes.items() if s is None)
    if unknown:
        raise CaSyncError(
            f"{alg.name} needs each gradient's shape (its 2-D view): pass (name, tensor) pairs, "
            f"not counts, for {unknown[:3]}"
        )


def _entry(name: str, numel: int, rounds: bool) -> TensorPlan:
    strategy = Strategy.ROUNDS if rounds else Strategy.ALLREDUCE
    return TensorPlan(name, numel, rounds, strategy)


def make_plan(alg: RoundsAlgorithm, numels: Sequence[tuple[str, int]], shapes: Shapes,
              world_size: int, selection: Selection | None) -> Plan:  # fmt: skip
    """The default plan (see the module docstring): ``meta["kept_plain"]`` says why each plain
    tensor is; ``meta["embeddings"]`` lists the embeddings that would run the rounds, plain
    until their rows are counted (:func:`decide_rows`)."""
    select = selection or Selection()
    entries, kept, embeddings = [], {}, []
    for name, numel in numels:
        shape = shapes[name]
        assert shape is not None
        why = select.reason(name, shape, implicit=False)
        if why is None and not compresses(alg, shape, MIN_COMPRESSION_RATE):
            why = f"{len(shape)}-D" if len(shape) < 2 else "its rounds save too little"
        if why is None and select.is_embedding(name, shape) and len(shape) == 2:
            embeddings.append(name)
            why = "embedding (rows counted in the first step)"
        if why is not None:
            kept[name] = why
        entries.append(_entry(name, numel, why is None))
    meta = {"planner": "rounds", "rounds": list(alg.rounds), "kept_plain": kept,
            "embeddings": embeddings}  # fmt: skip
    return Plan(alg.name, dict(alg.params), world_size, tuple(entries), meta=meta)


def check_plan(plan: Plan, alg: RoundsAlgorithm, numels: Sequence[tuple[str, int]],
               shapes: Shapes, world_size: int) -> Plan:  # fmt: skip
    """``plan`` (given explicitly) if a multi-round algorithm can run it; else
    :class:`PlanError` naming the tensor."""
    if plan.algorithm != alg.name:
        raise PlanError(f"plan is for algorithm {plan.algorithm!r}, the hook runs {alg.name!r}")
    if plan.world_size != world_size:
        raise PlanError(f"plan was made for world_size {plan.world_size}, this run has {world_size}")
    by_name = {e.name: e for e in plan.entries}
    want = dict(numels)
    if set(by_name) != set(want):
        missing, extra = sorted(set(want) - set(by_name)), sorted(set(by_name) - set(want))
        raise PlanError(f"plan does not cover the model: missing {missing[:5]}, unknown {extra[:5]}")
    for e in plan.entries:
        if e.numel != want[e.name]:
            raise PlanError(f"{e.name}: plan has {e.numel} elements, the model {want[e.name]}")
        if e.compress and e.strategy is not Strategy.ROUNDS:
            raise PlanError(
                f"{e.name}: strategy {e.strategy.value} with the multi-round {alg.name}: a "
                "tensor runs its rounds (strategy rounds), goes plain or as exact rows"
            )
        if e.strategy is Strategy.ROUNDS and len(shapes[e.name] or ()) < 2:
            raise PlanError(f"{e.name}: {alg.name}'s rounds need a tensor of 2 or more dimensions")
    return plan


def row_candidates(plan: Plan, shapes: Shapes) -> dict[str, int]:
    """``name -> rows`` of the plan's embeddings still plain until their rows are counted."""
    names = set(plan.meta.get("embeddings") or ())
    out = {}
    for e in plan.entries:
        shape = shapes.get(e.name)
        if e.name in names and not e.compress and not e.row_bound and shape and shape[0] > 1:
            out[e.name] = int(shape[0])
    return out


def _rows_plan(plan: Plan, measured: Mapping[str, tuple[int, int]], world_size: int) -> Plan:
    """``plan`` with each measured embedding as exact rows where :func:`plan_rows` says rows
    pay, else running the rounds."""
    rows = plan_rows(plan, measured, world_size)
    dense = dict(plan.meta.get("embedding_dense") or {})  # (plan="auto": rounds or plain)
    entries = tuple(
        e if e.row_bound or e.name not in measured
        else _entry(e.name, e.numel, dense.get(e.name, "rounds") == "rounds")
        for e in rows.entries
    )  # fmt: skip
    kept = {k: v for k, v in dict(rows.meta.get("kept_plain") or {}).items()
            if k not in measured or dense.get(k) == "plain"}  # fmt: skip
    return dataclasses.replace(rows, entries=entries, meta={**rows.meta, "kept_plain": kept})


def decide_rows(state: Any, rt: Any, device: torch.device) -> Any:
    """The row decision of a multi-round state (every rank, at the start of a step): the
    largest touched-row count over the group decides; returns the runtime to run with (every
    state carried over, new zero ones for embeddings that run the rounds from now on)."""
    probe = state._rows
    names = sorted(probe.rows)
    counts = torch.tensor([probe.touched.get(n, probe.rows[n]) for n in names], dtype=torch.int64)
    counts = counts.to(device)
    dist.all_reduce(counts, op=dist.ReduceOp.MAX, group=state.process_group)
    measured = {n: (probe.rows[n], int(c))
                for n, c in zip(names, counts.cpu().tolist(), strict=True)}  # fmt: skip
    plan = _rows_plan(rt.plan, measured, state.world_size)
    chosen = {e.name for e in plan.entries if e.row_bound}
    rounds_of = {e.name: e.compress for e in plan.entries}
    for name, (rows, most) in measured.items():
        log.info("casync: %s: at most %d of %d rows touched in a step on any rank: %s", name,
                 most, rows, "exact rows from now on" if name in chosen else
                 "plain from now on" if rounds_of.get(name) is False else
                 f"{state.algorithm.name}'s rounds from now on")  # fmt: skip
    base = _rows_plan(rt.base_plan, measured, state.world_size)
    new = [e for e in plan.entries if e.name in measured and e.name not in chosen and e.compress]
    worker = {**rt.worker_states,
              **rounds_states(state.algorithm, new, state._devices, dict(state._shapes))}  # fmt: skip
    return replan(state, rt, plan, base, states=(worker, rt.server_states))


def resolve_any(algorithm: Any, params: Mapping[str, Any] | None, backend: str) -> Any:
    """``algorithm`` resolved: a multi-round one (:func:`resolve`), else
    :func:`~hipress.codec.algorithm.resolve_algorithm`'s."""
    multi = resolve(algorithm, params, backend)
    return multi if multi is not None else resolve_algorithm(algorithm, params, backend)


def auto_plan(alg: RoundsAlgorithm, numels: Sequence[tuple[str, int]], shapes: Shapes,
              selection: Selection | None, group: Any = None, device: Any = None) -> Plan:  # fmt: skip
    """SeCoPa's plan (``plan="auto"``): every rank measures the network (the collectives in
    ``group``, up to the largest gradient's float32 bytes), the encodes and decode of each
    shape that may run the rounds (on the group's device) and a float32 pass; rank 0 plans
    (:func:`~hipress.secopa.model.rounds_planner.plan_rounds`) and sends the plan to all.
    Every rank must call it; returns the same plan on every rank."""
    comm = TorchComm(group, device)
    top = max((n for _, n in numels), default=1)
    most = 4 * max(top, 1 << 10)  # (the sizes the plan prices, and one step above)
    sizes = [s for s in DEFAULT_NETWORK_SIZES if s < most]
    reps = DEFAULT_NETWORK_REPS[: len(sizes)]
    net = measure_network(group, [*sizes, most], [*reps, reps[-1]], comm=comm, extend=False)
    select = selection or Selection()
    named = [(n, tuple(shapes[n] or ())) for n, _ in numels]
    wanted = sorted({s for n, s in named if len(s) >= 2 and select.reason(n, s, implicit=False)
                     is None})  # fmt: skip
    compute = {s: measure_compute_ms(alg, s, budget_s=0.3, device=comm.device) for s in wanted}
    profile = RoundsProfile(net.ops, compute, measure_merge(), meta=network_meta(net))
    result: Plan | Exception | None = None
    if comm.rank == 0:
        try:
            result = plan_rounds(alg, named, comm.size, profile, select)
        except PlanError as exc:
            result = exc
    plan = broadcast_plan(result, comm=comm)
    log.info("casync: plan %s (SeCoPa, %s): %d of %d tensors run the rounds", plan.digest(),
             alg.name, sum(e.compress for e in plan.entries), len(plan.entries))  # fmt: skip
    return plan
