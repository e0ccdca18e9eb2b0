"""The INFO line a state writes when it adopts a plan: what it compresses and why.

A plan comes from the default rule (a size threshold), SeCoPa (``plan="auto"``: predicted
times), or the user (a file or a :class:`~hipress.core.plan.Plan`). ``plan="auto"`` first runs
short-lived probe states on synthetic gradients to calibrate its cost model; their plans are
candidates, not the run's, and their lines say so (at DEBUG).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hipress.core.plan import Plan
from hipress.core.rule import DefaultRule

__all__ = ["log_adopted", "plan_reason"]


def _kept(plan: Plan) -> str:
    """``; kept plain: embeddings (2), ...`` from ``meta["kept_plain"]``, or ''."""
    kept: Mapping[str, str] = plan.meta.get("kept_plain", {}) or {}
    counts: dict[str, int] = {}
    for why in kept.values():
        counts[why] = counts.get(why, 0) + 1
    return "".join(f"; kept plain ({n}): {why}" for why, n in counts.items())


def plan_reason(plan: Plan, source: Plan | str | Path | None, rule: DefaultRule | None) -> str:
    """Why ``plan`` (made from the ``plan=`` argument ``source``) compresses what it does."""
    on = sum(e.compress for e in plan.entries)
    if isinstance(source, str) and source == "auto":
        t = plan.totals
        why = "SeCoPa's plan (plan='auto')"
        if "planned" in t and "all_uncompressed" in t:
            why += (f": predicted sync {t['planned']:.2f} ms against {t['all_uncompressed']:.2f} "
                    "ms uncompressed")  # fmt: skip
        if on == 0:
            why += "; compressing was predicted slower than the plain allreduce for every tensor"
        return why + _kept(plan)
    if source is None or (isinstance(source, str) and source == "default"):
        r = rule or DefaultRule()
        return (f"the default rule: tensors of at least {r.min_compress_numel} elements are "
                f"compressed, {len(plan.entries) - on} smaller or excluded ones kept plain"
                f"{_kept(plan)}")  # fmt: skip
    if isinstance(source, Plan):
        return "the plan given" + _kept(plan)
    return f"the plan file {source}" + _kept(plan)


def log_adopted(
    logger: logging.Logger, plan: Plan, source: Any, rule: DefaultRule | None,
    world_size: int, probe: bool,
) -> None:  # fmt: skip
    """Log the plan a state adopts: INFO for the run's own, DEBUG for a calibration probe."""
    on, n = sum(e.compress for e in plan.entries), len(plan.entries)
    if probe:
        logger.debug("casync: SeCoPa calibration probe (synthetic gradients, not this run's "
                     "plan): %d of %d tensors compressed", on, n)  # fmt: skip
        return
    logger.info("casync: %s, %d of %d tensors compressed, world size %d: %s", plan.algorithm,
                on, n, world_size, plan_reason(plan, source, rule))  # fmt: skip
