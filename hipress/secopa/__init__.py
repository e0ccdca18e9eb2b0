"""SeCoPa: a measured cost model that plans, per tensor, whether and how to compress.

Two rooms. :mod:`hipress.secopa.model` is the pure cost model: a :class:`Profile` (what one
algorithm costs on one cluster), the strategy formulas and :mod:`~hipress.secopa.model.costmodel`
(every strategy's time for every K), :mod:`~hipress.secopa.model.selection` (the sizes to
compress) and :mod:`~hipress.secopa.model.planner` (a model's parameters to a :class:`Plan`);
it measures nothing and needs no process group. :mod:`hipress.secopa.measure` measures on this
cluster: :mod:`~hipress.secopa.measure.profiler` times compute costs and assembles a profile,
:mod:`~hipress.secopa.measure.netprofiler` its network (or :meth:`Profile.with_link` takes the
network from the user), :mod:`~hipress.secopa.measure.runtime` plans once on rank 0 and
broadcasts it (``auto_plan`` is what CaSync's and ``hipress.horovod``'s ``plan="auto"`` call),
over the transport :mod:`~hipress.secopa.measure.comm`. With the gradients' ready times
(:func:`measure_readiness`, held by the profile) the planner minimises the exposed time of the
whole step (:mod:`~hipress.secopa.model.exposure`). See docs/explanation/secopa.md.
"""

from __future__ import annotations

from hipress.core.plan import Plan, PlanError, Strategy, TensorPlan
from hipress.secopa.measure.comm import Comm, TorchComm
from hipress.secopa.measure.readiness import ReadyClock, measure_readiness
from hipress.secopa.measure.runtime import (
    auto_plan,
    auto_profile,
    check_plan,
    load_plan_for_model,
    plan_for_model,
)
from hipress.secopa.model.costmodel import CASYNC_FORMULAS, ORIGINAL_FORMULAS, CostModel
from hipress.secopa.model.planner import Planner, PlannerConfig, plan_named
from hipress.secopa.model.profile import Profile, ProfileError, affine_profile, link_network
from hipress.secopa.model.readiness import Readiness

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
    "Readiness",
    "ReadyClock",
    "Strategy",
    "TensorPlan",
    "TorchComm",
    "affine_profile",
    "auto_plan",
    "auto_profile",
    "check_plan",
    "link_network",
    "load_plan_for_model",
    "measure_readiness",
    "plan_for_model",
    "plan_named",
]
