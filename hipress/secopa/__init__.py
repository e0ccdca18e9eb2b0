"""SeCoPa: a measured cost model that plans, per tensor, whether and how to compress.

Stages: :mod:`~hipress.secopa.profiler` measures compute costs and assembles a
:class:`Profile`, :mod:`~hipress.secopa.netprofiler` its network (or
:meth:`Profile.with_link` takes the network from the user); :mod:`~hipress.secopa.costmodel`
predicts every strategy's time for every K; :mod:`~hipress.secopa.selection` chooses the sizes
to compress and :mod:`~hipress.secopa.planner` turns a model's parameters into a
:class:`Plan` with it; :mod:`~hipress.secopa.runtime` plans once on rank 0 and broadcasts it
(``auto_plan`` is what CaSync's and ``hipress.horovod``'s ``plan="auto"`` call);
:mod:`~hipress.secopa.comm` is the transport both measure and broadcast over. See
docs/explanation/secopa.md.
"""

from __future__ import annotations

from hipress.core.plan import Plan, PlanError, Strategy, TensorPlan
from hipress.secopa.comm import Comm, TorchComm
from hipress.secopa.costmodel import CASYNC_FORMULAS, ORIGINAL_FORMULAS, CostModel
from hipress.secopa.planner import Planner, PlannerConfig, plan_named
from hipress.secopa.profile import Profile, ProfileError, affine_profile, link_network
from hipress.secopa.runtime import (
    auto_plan,
    auto_profile,
    check_plan,
    load_plan_for_model,
    plan_for_model,
)

__all__ = [
    "CASYNC_FORMULAS",
    "ORIGINAL_FORMULAS",
    "Comm",
    "CostModel",
    "Plan",
    "PlanError",
    "Planner",
    "PlannerConfig",
    "Profile",
    "ProfileError",
    "Strategy",
    "TensorPlan",
    "TorchComm",
    "affine_profile",
    "auto_plan",
    "auto_profile",
    "check_plan",
    "link_network",
    "load_plan_for_model",
    "plan_for_model",
    "plan_named",
]
