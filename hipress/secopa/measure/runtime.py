"""Planning inside a training job: one plan, computed on one rank, held by every rank.

- :func:`plan_for_model` plans on the source rank and broadcasts the plan
  (``broadcast_object_list``), so every rank holds the identical plan (same :meth:`Plan.digest`);
  without a process group it just plans.
- :func:`auto_plan` is what ``plan="auto"`` in the DDP hook calls (through
  :mod:`hipress.casync.profiling`, which passes CaSync's step probe for the calibration): it
  measures the network in the current group and the algorithm's compute costs (a few seconds in
  all), then plans as above. ``hipress.horovod``'s ``plan="auto"`` calls it with ``comm=`` a Horovod
  :class:`~hipress.secopa.measure.comm.Comm`, so the same measurement and broadcast run over Horovod.
- Either takes the gradients' ready times (``readiness=``, measured by
  :func:`~hipress.secopa.measure.readiness.measure_readiness`): the profile then holds them and
  the plan minimises the exposed time of the whole step rather than the sum of per-tensor costs.
- :func:`load_plan_for_model` / :func:`check_plan` reject a plan that does not fit the model or
  the world size, with a message saying what differs.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hipress.core.plan import Plan, PlanError
from hipress.secopa.measure.broadcast import broadcast_plan
from hipress.secopa.measure.calibrate import StepProbe, calibrate
from hipress.secopa.measure.comm import Comm, TorchComm
from hipress.secopa.measure.netprofiler import measure_network, measure_overlap, network_meta
from hipress.secopa.measure.profiler import build_profile, measure_compute
from hipress.secopa.measure.timed_codec import TimedAlgorithm, as_timed_codec
from hipress.secopa.model.bucketcap import recommend_cap
from hipress.secopa.model.planner import PlannerConfig, plan_named
from hipress.secopa.model.profile import Profile
from hipress.secopa.model.readiness import Readiness
from hipress.secopa.model.rowcost import RowDensity

log = logging.getLogger(__name__)

NamedNumels = Sequence[tuple[str, int]]
PROBE_NUMEL = 1 << 21  # elements per tensor of the calibration probe, at most
# and of the second probe, at the model's largest tensor when that is 4x larger or more (the
# in-step slowdown differs with the size: in lstm-lm's steps on loopback the 51M-element
# tensors' compute ran at 1.0x its profile, where the 2M probe measured 1.4-1.5x)
LARGE_PROBE_NUMEL = 1 << 26


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


def plan_for_model(
    model: nn.Module | Iterable[tuple[str, int]],
    profile: Profile | None,
    world_size: int | None = None,
    config: PlannerConfig | None = None,
    group: Any = None,
    *,
    comm: Comm | None = None,
    rows: Mapping[str, RowDensity] | None = None,
    plain: Collection[str] = (),
) -> Plan:
    """Plan a model; in a process group (or over ``comm``), plan on rank 0 and broadcast.

    Args:
        model: a module (its trainable parameters) or ``(name, numel)`` pairs.
        profile: the costs; only rank 0's is used (others may pass None).
        world_size: N to plan for (default: the group's size, or 1 without a group).
        config: planner settings.
        group: process group (default: the default group, if initialised).
        comm: the ranks to plan for, instead of ``group`` (e.g. Horovod's).
        rows: the gradients that may travel as rows, priced by the planner
            (:meth:`~hipress.secopa.model.planner.Planner.plan`).
        plain: parameters the plan keeps uncompressed (a selection's exclusions).
    Returns the plan, identical on every rank, checked against ``model``.
    """
    named = named_numels(model)
    if comm is None and not dist.is_initialized():
        if profile is None:
            raise PlanError("plan_for_model needs a profile")
        return plan_named(named, profile, world_size or 1, config, rows, plain)
    comm = comm if comm is not None else TorchComm(group)
    world = comm.size
    result: Plan | PlanError | None = None
    if comm.rank == 0:
        try:
            if profile is None:
                raise PlanError("rank 0 has no profile to plan with")
            result = _with_readiness(
                plan_named(named, profile, world_size or world, config, rows, plain), named,
                profile, world_size or world, config, rows, plain,
            )  # fmt: skip
        except PlanError as exc:
            result = exc
    plan = broadcast_plan(result, comm=comm)
    check_plan(plan, named)
    log.info("plan %s: %d of %d tensors compressed", plan.digest(), _ncomp(plan), len(named))
    return plan


def _with_readiness(plan: Plan, named: NamedNumels, profile: Profile, world: int,
                    config: PlannerConfig | None, rows: Mapping[str, RowDensity] | None,
                    plain: Collection[str]) -> Plan:  # fmt: skip
    """``plan`` with, when the profile holds ready times, those times
    (``meta["readiness"]``, so a saved plan can be made again) and the DDP ``bucket_cap_mb``
    SeCoPa recommends (``meta["bucket_cap"]``, :func:`~hipress.secopa.model.bucketcap.
    recommend_cap`)."""
    if profile.readiness is None:
        return plan
    advice = recommend_cap(named, profile, world, config, rows, plain=plain)
    meta = {**plan.meta, "readiness": profile.readiness.to_dict(),
            "bucket_cap": advice.to_dict()}  # fmt: skip
    return dataclasses.replace(plan, meta=meta)


def _ncomp(plan: Plan) -> int:
    return sum(e.compress for e in plan.entries)


def auto_profile(
    algorithm: object,
    group: Any = None,
    compute_budget_s: float = 1.5,
    overlap: bool = True,
    max_numel: int | None = None,
    *,
    comm: Comm | None = None,
    calibrate_step: bool = True,
    device: torch.device | str | None = None,
    probe: StepProbe | None = None,
    readiness: Readiness | None = None,
) -> Profile:
    """Measure a profile in the current process group (or over ``comm``, e.g. Horovod's);
    every rank must call it.

    The network (all four collectives; the allreduce, where cheap, up to ``max_numel`` elements
    if given: the model's largest tensor) and the overlap are measured together by all ranks;
    compute costs are measured by every rank at the same time (as they will run in training),
    up to ``max_numel`` elements if given. Then, over
    ``torch.distributed`` and for a CompLL algorithm, the profile is calibrated against CaSync's
    real steps in the group (:func:`~hipress.secopa.measure.calibrate.calibrate`: compute inside a step
    and CaSync's fixed cost per collective) run by ``probe`` (CaSync's:
    :func:`hipress.casync.profiling.auto_profile` passes it), unless ``calibrate_step`` is false
    or there is no ``probe`` (the profile then stays uncalibrated). Each rank
    returns its own profile; the network part and the calibration are identical on all ranks.
    ``device``: where the model trains (default: the group's, :func:`~hipress.secopa.measure.comm.
    default_device`); collectives and kernels are measured there, on a GPU with CUDA events.
    ``readiness``: the gradients' ready times
    (:func:`~hipress.secopa.measure.readiness.measure_readiness`), held by the profile.
    """
    if comm is None:
        comm = TorchComm(group, device)
    dev = getattr(comm, "device", None) if device is None else torch.device(device)
    codec = as_timed_codec(algorithm, dev)
    top = max(max_numel, 512) if max_numel is not None else None
    net = measure_network(group, comm=comm, largest=4 * top if top is not None else None)
    ov = measure_overlap(codec, group, n=1 << 20, comm=comm, network=net.ops) if overlap else 1.0
    compute = measure_compute(codec, budget_s=compute_budget_s, max_size=top)
    profile = build_profile(codec, compute, net.ops, overlap=ov, meta=network_meta(net))
    torch_comm = comm is None or isinstance(comm, TorchComm)
    if probe is None and calibrate_step and torch_comm:
        log.debug("auto_profile: no step probe given, the profile is not calibrated")
    if probe is not None and calibrate_step and torch_comm and isinstance(codec, TimedAlgorithm):
        group = comm.group if isinstance(comm, TorchComm) else group
        numel = min(top, PROBE_NUMEL) if top is not None else PROBE_NUMEL
        large = min(top, LARGE_PROBE_NUMEL) if top is not None else None
        profile = calibrate(
            codec.alg, profile, group, numel=numel, large=large, device=dev, probe=probe
        )
    return profile if readiness is None else profile.with_readiness(readiness)


def auto_plan(
    algorithm: object,
    model: nn.Module | Iterable[tuple[str, int]],
    world_size: int | None = None,
    *,
    group: Any = None,
    config: PlannerConfig | None = None,
    compute_budget_s: float = 1.5,
    comm: Comm | None = None,
    device: torch.device | str | None = None,
    probe: StepProbe | None = None,
    readiness: Readiness | None = None,
    rows: Mapping[str, RowDensity] | None = None,
    plain: Collection[str] = (),
) -> Plan:
    """Profile (see :func:`auto_profile`) and plan on rank 0, broadcast to all ranks.

    Args:
        algorithm: a CompLL algorithm object or a :class:`~hipress.secopa.measure.timed_codec.Codec`.
        model: a module or its ``(name, numel)`` pairs.
        world_size: checked against the group's size if given.
        group: the process group CaSync synchronises over (default: the default group).
        comm: the transport to profile and broadcast over instead of ``group`` (the Horovod
            optimizer passes Horovod's, see :mod:`hipress.horovod.comm`).
        device: where the model trains (default: the group's device); profiled there.
        probe: runs real sync steps to calibrate the profile (see :func:`auto_profile`).
        readiness: the gradients' ready times (rank 0's are used): the plan then minimises
            the exposed time of the step (:mod:`hipress.secopa.model.exposure`).
        rows: the gradients that may travel as rows (:mod:`hipress.secopa.model.rowcost`);
            with no row count yet, the plan records each one's break-even count.
        plain: parameters the plan keeps uncompressed (a selection's exclusions).
    Needs an initialised process group (or ``comm``); every rank must call it. Takes a few
    seconds. Returns the plan, identical on every rank.
    """
    if comm is None:
        if not dist.is_initialized():
            raise PlanError("auto_plan needs an initialised process group (or plan with a profile)")
        comm = TorchComm(group, device)
    world = comm.size
    if world_size is not None and world_size != world:
        raise PlanError(f"auto_plan asked for {world_size} workers, the group has {world}")
    named = named_numels(model)
    top = max((k for _, k in named), default=None)
    profile = auto_profile(
        algorithm, group, compute_budget_s, max_numel=top, comm=comm, device=device, probe=probe,
        readiness=readiness,
    )  # fmt: skip
    mine = profile if comm.rank == 0 else None
    return plan_for_model(named, mine, world, config, comm=comm, rows=rows, plain=plain)
