"""Planning inside a training job: one plan, computed on one rank, held by every rank.

- :func:`plan_for_model` plans on the source rank and broadcasts the plan
  (``broadcast_object_list``), so every rank holds the identical plan (same :meth:`Plan.digest`);
  without a process group it just plans.
- :func:`auto_plan` is what ``plan="auto"`` in the DDP hook calls: it measures the network in
  the current group and the algorithm's compute costs (a few seconds in all), then plans as
  above.
- :func:`load_plan_for_model` / :func:`check_plan` reject a plan that does not fit the model or
  the world size, with a message saying what differs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch import nn

from hipress.secopa.codec import as_codec
from hipress.secopa.plan import Plan, PlanError
from hipress.secopa.planner import PlannerConfig, plan_named
from hipress.secopa.profile import Profile
from hipress.secopa.profiler import (
    build_profile,
    measure_compute,
    measure_network,
    measure_overlap,
    network_meta,
)

log = logging.getLogger(__name__)

NamedNumels = Sequence[tuple[str, int]]


def named_numels(model: nn.Module | Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
    """``(name, numel)`` of a module's trainable parameters, or the pairs given."""
    if isinstance(model, nn.Module):
        return [(n, p.numel()) for n, p in model.named_parameters() if p.requires_grad]
    return [(str(n), int(k)) for n, k in model]


def check_plan(
    plan: Plan, model: nn.Module | Iterable[tuple[str, int]], world_size: int | None = None
) -> None:
    """Raise :class:`PlanError` unless ``plan`` covers exactly the model's parameters (names
    and sizes) and, if given, was made for ``world_size`` workers."""
    if world_size is not None and plan.world_size != world_size:
        raise PlanError(
            f"plan was made for {plan.world_size} workers but this job has {world_size}; "
            "re-plan for this world size"
        )
    plan.check_matches(named_numels(model))


def load_plan_for_model(
    path: str | Path, model: nn.Module | Iterable[tuple[str, int]], world_size: int | None = None
) -> Plan:
    """Load a saved plan and check it against the model (see :func:`check_plan`)."""
    try:
        plan = Plan.load(path)
    except OSError as exc:
        raise PlanError(f"cannot read plan {path}: {exc.strerror}") from None
    check_plan(plan, model, world_size)
    return plan


def _group_info(group: Any) -> tuple[int, int, int]:
    """(rank in group, group size, global rank of the group's rank 0)."""
    rank = dist.get_rank(group)
    world = dist.get_world_size(group)
    src = dist.get_global_rank(group, 0) if group is not None else 0
    return rank, world, src


def broadcast_plan(plan: Plan | Exception | None, group: Any = None) -> Plan:
    """Send the plan from the group's rank 0 to every rank; return it on every rank.

    Rank 0 passes the plan; the others pass None. If rank 0 passes a :class:`PlanError`
    instead (planning failed), every rank raises it, so no rank waits forever.
    """
    rank, _, src = _group_info(group)
    box: list[Any] = [None]
    if rank == 0:
        box = [plan.to_dict() if isinstance(plan, Plan) else {"error": str(plan)}]
    dist.broadcast_object_list(box, src=src, group=group)
    payload = box[0]
    if "error" in payload:
        raise PlanError(f"planning failed on rank 0: {payload['error']}")
    return Plan.from_dict(payload)


def plan_for_model(
    model: nn.Module | Iterable[tuple[str, int]],
    profile: Profile | None,
    world_size: int | None = None,
    config: PlannerConfig | None = None,
    group: Any = None,
) -> Plan:
    """Plan a model; in a process group, plan on rank 0 and broadcast.

    Args:
        model: a module (its trainable parameters) or ``(name, numel)`` pairs.
        profile: the costs; only rank 0's is used (others may pass None).
        world_size: N to plan for (default: the group's size, or 1 without a group).
        config: planner settings.
        group: process group (default: the default group, if initialised).
    Returns the plan, identical on every rank, checked against ``model``.
    """
    named = named_numels(model)
    if not dist.is_initialized():
        if profile is None:
            raise PlanError("plan_for_model needs a profile")
        return plan_named(named, profile, world_size or 1, config)
    rank, world, _ = _group_info(group)
    result: Plan | PlanError | None = None
    if rank == 0:
        try:
            if profile is None:
                raise PlanError("rank 0 has no profile to plan with")
            result = plan_named(named, profile, world_size or world, config)
        except PlanError as exc:
            result = exc
    plan = broadcast_plan(result, group)
    check_plan(plan, named)
    log.info("plan %s: %d of %d tensors compressed", plan.digest(), _ncomp(plan), len(named))
    return plan


def _ncomp(plan: Plan) -> int:
    return sum(e.compress for e in plan.entries)


def auto_profile(
    algorithm: object,
    group: Any = None,
    compute_budget_s: float = 1.5,
    overlap: bool = True,
    max_numel: int | None = None,
) -> Profile:
    """Measure a profile in the current process group; every rank must call it.

    The network (all four collectives) and the overlap are measured together by all ranks;
    compute costs are measured by every rank at the same time (as they will run in training),
    up to ``max_numel`` elements if given (the model's largest tensor). Each rank returns its
    own profile; the network part is identical on all ranks.
    """
    codec = as_codec(algorithm)
    net = measure_network(group)
    ov = measure_overlap(codec, group) if overlap else 1.0
    top = max(max_numel, 512) if max_numel is not None else None
    compute = measure_compute(codec, budget_s=compute_budget_s, max_size=top)
    return build_profile(codec, compute, net.ops, overlap=ov, meta=network_meta(net))


def auto_plan(
    algorithm: object,
    model: nn.Module | Iterable[tuple[str, int]],
    world_size: int | None = None,
    *,
    group: Any = None,
    config: PlannerConfig | None = None,
    compute_budget_s: float = 1.5,
) -> Plan:
    """Profile (see :func:`auto_profile`) and plan on rank 0, broadcast to all ranks.

    Args:
        algorithm: a CompLL algorithm object or a :class:`~hipress.secopa.codec.Codec`.
        model: a module or its ``(name, numel)`` pairs.
        world_size: checked against the group's size if given.
        group: the process group CaSync synchronises over (default: the default group).
    Needs an initialised process group; every rank must call it. Takes a few seconds.
    Returns the plan, identical on every rank.
    """
    if not dist.is_initialized():
        raise PlanError("auto_plan needs an initialised process group (or plan with a profile)")
    world = dist.get_world_size(group)
    if world_size is not None and world_size != world:
        raise PlanError(f"auto_plan asked for {world_size} workers, the group has {world}")
    named = named_numels(model)
    top = max((k for _, k in named), default=None)
    profile = auto_profile(algorithm, group, compute_budget_s, max_numel=top)
    rank = dist.get_rank(group)
    return plan_for_model(named, profile if rank == 0 else None, world, config, group)
