"""One call for users: :func:`register` puts a :class:`CompressedReduceScatter` on every
``fully_shard``-ed module of a model and returns the :class:`FsdpCompression` that holds them.

Each FSDP unit (a module ``fully_shard`` was called on, with parameters of its own) gets its own
states, laid out once from the unit's padded size. Which units compress is ``plan``'s
(:mod:`hipress.fsdp.planning`): by default small units stay uncompressed, by the default
rule (:class:`~hipress.core.rule.DefaultRule`: fewer than ``min_compress_numel``
elements); ``plan="auto"`` lets SeCoPa's cost model decide per unit; a mapping or a callable
gives the user's decisions. The decisions are ``FsdpCompression.plan``. With
``replicate_group``, each unit also gets a :class:`ReplicaAllReduce` hook that averages its
reduced shard across replicas, compressed where the unit's reduce-scatter is (hierarchical
data parallelism).

The state object (:mod:`hipress.fsdp.state`) reports per-rank memory and counters and
checkpoints.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultReduceScatter

from hipress.codec.algorithm import build_kernels, resolve_algorithm
from hipress.codec.errors import CaSyncError
from hipress.codec.planning import DEFAULT_ALGORITHM
from hipress.core.compression import CompressionAlgorithm
from hipress.core.rule import DefaultRule, Selection, Shapes, embedding_names
from hipress.core.torchcompat import fsdp_param_groups
from hipress.fsdp.agree import agree, settings
from hipress.fsdp.collective import CompressedReduceScatter
from hipress.fsdp.errors import FsdpError
from hipress.fsdp.feedback import resolve_feedback
from hipress.fsdp.planning import (
    FsdpPlan,
    PlanArg,
    UnitInfo,
    UnitPlan,
    check_plan_arg,
    local_decisions,
    plan_units,
)
from hipress.fsdp.replicate import ReplicaAllReduce
from hipress.fsdp.selection import keep_units_plain, unit_reasons, warn_lossy_units
from hipress.fsdp.state import FsdpCompression
from hipress.secopa.model.profile import Profile

__all__ = ["FsdpCompression", "register"]

log = logging.getLogger(__name__)


def _unit(module: FSDPModule, name: str) -> Any:
    """The FSDP param group of ``module``'s unit (None for a module with no parameters of its
    own): the object that ``set_custom_reduce_scatter`` itself configures."""
    groups = fsdp_param_groups(module._get_fsdp_state())
    if not groups:
        return None
    if len(groups) > 1:
        raise FsdpError(
            f"{name} has several FSDP param groups (shard_placement_fn with several meshes), "
            "which cannot take a custom reduce-scatter"
        )
    return groups[0]


def register(
    model: nn.Module,
    algorithm: str | CompressionAlgorithm = DEFAULT_ALGORITHM,
    params: Mapping[str, Any] | None = None,
    *,
    feedback: str = "auto",
    min_compress_numel: int = 1 << 16,
    seed: int = 0,
    backend: str = "auto",
    replicate_group: dist.ProcessGroup | None = None,
    plan: PlanArg = "default",
    profile: Profile | str | Path | None = None,
    include: str | Sequence[str] | None = None,
    exclude: str | Sequence[str] | None = None,
    shapes: Shapes = "all",
) -> FsdpCompression:
    """Compress the gradient reduce-scatter of every ``fully_shard``-ed module of ``model``.

    Takes the model after ``fully_shard`` (the root or any module holding FSDP modules), an
    algorithm (a CompLL name loaded with ``params`` on ``backend``, or an algorithm object), a
    feedback option (:mod:`hipress.fsdp.feedback`: ``"auto"``, ``"none"``, ``"fp32"``,
    ``"bf16"``, ``"int8"``), the size under which a unit stays uncompressed, and the seed of
    the algorithms' random numbers (the same on every rank). With ``replicate_group`` (the
    ranks holding the same shards: the model is sharded on a 1-D mesh inside each replica),
    each unit's reduced shard is also averaged across the replicas, compressed. ``plan`` says
    which units compress (:mod:`hipress.fsdp.planning`): ``"default"`` (the size rule above),
    ``"auto"`` (SeCoPa prices each unit's plain and compressed reduce-scatter, on ``profile``
    if given, a :class:`~hipress.secopa.model.profile.Profile` or its JSON file, else on one it
    measures in the units' process group: a second or two, every rank taking part), or a
    mapping ``{unit name: bool}`` (units left out follow the size rule), a callable
    ``name -> bool`` or an earlier :class:`FsdpPlan`; None is ``"default"``. ``include``,
    ``exclude`` and ``shapes`` (:class:`~hipress.core.rule.Selection`, patterns on
    ``model.named_parameters()`` names) keep units plain (:mod:`hipress.fsdp.selection`): the
    default and ``"auto"`` plans keep a unit holding an embedding weight (by module type) or
    only 1-D tensors plain unless ``include`` names them; any plan keeps a unit holding an
    excluded parameter plain. Call it on every rank, before the first backward, with the same
    arguments: it is a collective over the default group that checks that every rank
    registers the same configuration (:mod:`hipress.fsdp.agree`). Returns the
    :class:`FsdpCompression`. Raises :class:`FsdpError` for a model without FSDP2 modules, one
    already registered, an unknown algorithm or bad parameters, a feedback option the algorithm
    cannot use, a ``replicate_group`` on a model FSDP2 already replicates (HSDP's 2-D mesh) or
    one that is not the group of this rank's replicas, a plan that is none of the above or
    names no unit, or a failure of register on another rank;
    :class:`~hipress.fsdp.errors.FsdpConfigMismatchError` (an :class:`FsdpError`) on every
    rank if the ranks' configurations differ; :class:`~hipress.codec.errors.CommError` if that
    check cannot complete (a rank exited or does not call register).
    """
    try:
        select = _selection(model, include, exclude, shapes)
        setup = _prepare(model, algorithm, params, feedback, min_compress_numel, seed, backend,
                         replicate_group, plan, profile)  # fmt: skip
        if setup.decisions is not None:  # (the user's own decisions: only what they asked)
            why = unit_reasons(model, list(setup.decisions), select, setup.plan_kind == "default")
            setup.decisions = keep_units_plain(setup.decisions, why)
    except Exception as exc:
        with contextlib.suppress(CaSyncError):  # this rank's error is the one to report
            agree(None, exc)  # the other ranks raise too, rather than wait for this one
        raise
    kind = setup.plan_kind
    replicas = None if replicate_group is None else replicate_group.size()
    agree(settings(setup.alg, setup.feedback, min_compress_numel, seed, kind, setup.decisions,
                   setup.infos, replicas))  # fmt: skip
    if setup.decisions is not None:
        decided = FsdpPlan(kind, setup.decisions)
    else:
        device = setup.groups[setup.infos[0].name].device
        decided = plan_units(plan, setup.infos, setup.alg, setup.rule, profile=profile,
                             device=device, feedback=setup.feedback)  # fmt: skip
        why = unit_reasons(model, list(decided.units), select)
        decided = FsdpPlan(decided.kind, keep_units_plain(decided.units, why), decided.meta)
    warn_lossy_units(model, decided.units, select, setup.alg.name)
    return _install(setup, decided, seed, replicate_group)


def _selection(model: nn.Module, include: Any, exclude: Any, shapes: Any) -> Selection:
    try:
        known = embedding_names(model) if isinstance(model, nn.Module) else None  # (else: below)
        select = Selection(include or (), exclude or (), shapes, known)
        if isinstance(model, nn.Module):
            select.check_names(n for n, p in model.named_parameters() if p.requires_grad)
        return select
    except ValueError as exc:
        raise FsdpError(str(exc)) from None


@dataclass
class _Setup:
    """What :func:`register` found and resolved on this rank, before any collective."""

    alg: CompressionAlgorithm
    feedback: str
    rule: DefaultRule
    infos: list[UnitInfo]
    groups: dict[str, Any]
    modules: dict[str, FSDPModule]
    plan_kind: str
    decisions: dict[str, UnitPlan] | None  # None for plan="auto", which measures


def _prepare(
    model: nn.Module,
    algorithm: str | CompressionAlgorithm,
    params: Mapping[str, Any] | None,
    feedback: str,
    min_compress_numel: int,
    seed: int,
    backend: str,
    replicate_group: dist.ProcessGroup | None,
    plan: PlanArg,
    profile: Profile | str | Path | None,
) -> _Setup:
    """Check the arguments, resolve the algorithm, find the units and, unless ``plan`` is
    ``"auto"``, decide them; build the kernels. Local to this rank."""
    if not isinstance(model, nn.Module):
        raise FsdpError(f"register takes an nn.Module, got {type(model).__name__}")
    if algorithm is None or algorithm == "none":
        raise FsdpError("register needs a compression algorithm (for none, do not register)")
    kind = check_plan_arg(plan, profile)
    for name, value in (("min_compress_numel", min_compress_numel), ("seed", seed)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise FsdpError(f"{name} must be an integer, got {value!r}")
    if replicate_group is not None and not isinstance(replicate_group, dist.ProcessGroup):
        raise FsdpError(
            "replicate_group must be a torch.distributed ProcessGroup (e.g. "
            f"mesh['replicate'].get_group()), got {type(replicate_group).__name__}"
        )
    try:
        alg = resolve_algorithm(algorithm, params, backend)
        rule = DefaultRule(min_compress_numel=min_compress_numel)
    except (CaSyncError, ValueError) as exc:
        raise FsdpError(str(exc)) from exc
    fb = resolve_feedback(alg, feedback)
    infos, groups, modules = _units(model, replicate_group)
    decisions = local_decisions(plan, infos, rule)
    try:  # the kernels now, not in the first backward
        build_kernels(alg, {g.device for g in groups.values()})
    except CaSyncError as exc:
        raise FsdpError(str(exc)) from exc
    return _Setup(alg, fb, rule, infos, groups, modules, kind, decisions)


def _units(
    model: nn.Module, replicate_group: dist.ProcessGroup | None
) -> tuple[list[UnitInfo], dict[str, Any], dict[str, FSDPModule]]:
    """Every FSDP unit of ``model`` with parameters of its own: its :class:`UnitInfo`, its
    param group and its module, by name. Raises :class:`FsdpError` for a model without any,
    one already registered, or a ``replicate_group`` that does not fit."""
    found = [
        (name or "<root>", m) for name, m in model.named_modules() if isinstance(m, FSDPModule)
    ]
    if not found:
        raise FsdpError(
            f"{type(model).__name__} has no fully_shard-ed module; call "
            "torch.distributed.fsdp.fully_shard on its blocks and on the root first"
        )
    groups: dict[str, Any] = {}
    modules: dict[str, FSDPModule] = {}
    infos: list[UnitInfo] = []
    for key, m in found:
        g = _unit(m, key)
        if g is None:
            continue
        current = g._reduce_scatter_comm
        if isinstance(current, CompressedReduceScatter):
            raise FsdpError(f"{key} already has a hipress reduce-scatter")
        if not isinstance(current, DefaultReduceScatter):
            log.warning("hipress.fsdp: replacing %s's reduce-scatter %s", key,
                        type(current).__name__)  # fmt: skip
        if replicate_group is not None and g._is_hsdp:
            raise FsdpError(
                f"{key} is sharded on a 2-D mesh (HSDP), where FSDP2 all-reduces across "
                "replicas itself; shard on the shard dimension only (mesh=mesh['shard']) to "
                "pass replicate_group"
            )
        group = g._reduce_scatter_process_group
        if replicate_group is not None:
            _check_replicas(key, group, replicate_group)
        ws = group.size()
        numel = ws * sum(fp.padded_sharded_param_size.numel() for fp in g.fsdp_params)
        infos.append(UnitInfo(key, numel, ws, _reduce_dtype(g), group))
        groups[key], modules[key] = g, m
    if not infos:
        raise FsdpError("no fully_shard-ed module of the model holds parameters")
    return infos, groups, modules


def _install(
    setup: _Setup, decided: FsdpPlan, seed: int, replicate_group: dist.ProcessGroup | None
) -> FsdpCompression:
    """Build every unit's reduce-scatter (and replica hook) and put them on the modules."""
    alg, fb = setup.alg, setup.feedback
    units: dict[str, CompressedReduceScatter] = {}
    replicas: dict[str, ReplicaAllReduce] = {}
    for u in setup.infos:
        key, g, compress = u.name, setup.groups[u.name], decided.units[u.name].compress
        ws, rank = u.world_size, g._reduce_scatter_process_group.rank()
        units[key] = CompressedReduceScatter(key, alg, fb, u.numel, ws, rank, g.device, compress,
                                             seed, seed_rank=dist.get_rank())  # fmt: skip
        if replicate_group is not None:
            replicas[key] = ReplicaAllReduce(key, alg, fb, u.numel // ws, replicate_group, rank,
                                             g.device, compress, seed)  # fmt: skip
    for key, m in setup.modules.items():
        m.set_custom_reduce_scatter(units[key])
        if key in replicas:
            m.set_all_reduce_hook(replicas[key])
    on = [k for k, u in units.items() if u.compress]
    log.info("hipress.fsdp: %s (feedback %s, plan %s) on %d of %d units", alg.name, fb,
             decided.kind, len(on), len(units))  # fmt: skip
    if dist.get_rank() == 0:
        log.info("%s", decided.table())
    return FsdpCompression(alg, fb, units, setup.modules, replicas, decided)


def _check_replicas(unit: str, shard_group: Any, replicate_group: Any) -> None:
    """Raise :class:`FsdpError` unless ``replicate_group`` meets ``unit``'s shard group in this
    rank alone: the replicas of a shard are one rank of each shard group."""
    shards = dist.get_process_group_ranks(shard_group)
    try:
        replicas = dist.get_process_group_ranks(replicate_group)
    except (RuntimeError, ValueError, KeyError, AttributeError, TypeError):
        raise FsdpError(
            f"replicate_group must be a process group this rank belongs to, got {replicate_group!r}"
        ) from None
    me = dist.get_rank()
    both = sorted(set(shards) & set(replicas))
    if both != [me]:
        where = (f"shares ranks {both} with" if len(both) > 1
                 else "does not hold this rank, a member of")  # fmt: skip
        raise FsdpError(
            f"replicate_group (ranks {replicas}) {where} {unit}'s shard group (ranks {shards}); "
            "it must hold the ranks with the same shards as this one, one from each shard "
            "group, else it averages different shards together. On a (replicate, shard) mesh, "
            "pass mesh['replicate'].get_group() and shard on mesh['shard']"
        )


def _reduce_dtype(group: Any) -> torch.dtype:
    """The dtype FSDP2 reduce-scatters this param group's gradients in: the policy's
    ``reduce_dtype``, else its ``param_dtype`` (the gradients' own), else the parameters'."""
    mp = group.mp_policy
    return mp.reduce_dtype or mp.param_dtype or group.fsdp_params[0].sharded_param.dtype
