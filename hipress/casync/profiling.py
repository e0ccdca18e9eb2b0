"""SeCoPa's online profiling with CaSync's real steps, all in one place.

SeCoPa sits below CaSync and never imports it; its calibration
(:func:`hipress.secopa.measure.calibrate.calibrate`) takes a :class:`~hipress.secopa.measure.calibrate.StepProbe`
instead. :data:`step_probe` is CaSync's (:class:`~hipress.casync.probe.StateProbe` over
:class:`~hipress.casync.state.CaSyncState`), and :func:`calibrate`, :func:`auto_profile` and
:func:`auto_plan` are SeCoPa's functions with it passed in (``plan="auto"`` runs the same).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import nn

from hipress.casync.probe import StateProbe, sync_step_ms
from hipress.casync.state import CaSyncState
from hipress.core.plan import Plan
from hipress.secopa.measure import calibrate as _calibrate
from hipress.secopa.measure import runtime as _runtime
from hipress.secopa.model.planner import PlannerConfig
from hipress.secopa.model.profile import Profile

__all__ = ["auto_plan", "auto_profile", "calibrate", "step_probe", "sync_step_ms"]

step_probe = StateProbe(CaSyncState)


def calibrate(algorithm: Any, profile: Profile, group: Any = None, **options: Any) -> Profile:
    """:func:`hipress.secopa.measure.calibrate.calibrate` with CaSync's :func:`step_probe` (``options``
    are its keyword arguments: ``numel``, ``warmup``, ``steps``, ``large``, ...)."""
    return _calibrate.calibrate(algorithm, profile, group, probe=step_probe, **options)


def auto_profile(algorithm: object, group: Any = None, **options: Any) -> Profile:
    """:func:`hipress.secopa.measure.runtime.auto_profile`, calibrated against CaSync's real steps
    (``options`` are its keyword arguments)."""
    options.setdefault("probe", step_probe)
    return _runtime.auto_profile(algorithm, group, **options)


def auto_plan(
    algorithm: object,
    model: nn.Module | Iterable[tuple[str, int]],
    world_size: int | None = None,
    *,
    group: Any = None,
    config: PlannerConfig | None = None,
    **options: Any,
) -> Plan:
    """:func:`hipress.secopa.measure.runtime.auto_plan` with the profile calibrated against CaSync's
    real steps: what ``plan="auto"`` runs. Every rank must call it; returns the same plan on
    every rank."""
    options.setdefault("probe", step_probe)
    return _runtime.auto_plan(algorithm, model, world_size, group=group, config=config, **options)
