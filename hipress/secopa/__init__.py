"""SeCoPa: a measured cost model that plans, per tensor, whether and how to compress."""

from __future__ import annotations

from hipress.secopa.plan import Plan, PlanError, Strategy, TensorPlan

__all__ = ["Plan", "PlanError", "Strategy", "TensorPlan"]
