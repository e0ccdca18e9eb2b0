"""One plan for every rank: rank 0's plan (or its planning error) broadcast to the group."""

from __future__ import annotations

from typing import Any

from hipress.core.plan import Plan, PlanError
from hipress.secopa.measure.comm import Comm, TorchComm

__all__ = ["broadcast_plan"]


def broadcast_plan(
    plan: Plan | Exception | None, group: Any = None, *, comm: Comm | None = None
) -> Plan:
    """Send the plan from the group's rank 0 (or ``comm``'s) to every rank; return it on every
    rank.

    Rank 0 passes the plan; the others pass None. If rank 0 passes a :class:`PlanError`
    instead (planning failed), every rank raises it, so no rank waits forever.
    """
    comm = comm if comm is not None else TorchComm(group)
    mine = None
    if comm.rank == 0:
        mine = plan.to_dict() if isinstance(plan, Plan) else {"error": str(plan)}
    payload = comm.broadcast_object(mine)
    if "error" in payload:
        raise PlanError(f"planning failed on rank 0: {payload['error']}")
    return Plan.from_dict(payload)
