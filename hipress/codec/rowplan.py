"""Which embeddings travel as rows: the decision the DDP hook and the Horovod wrapper share.

The default rule and ``plan="auto"`` keep embedding weights plain (:func:`candidates` finds
them in a plan); ``plan="auto"`` also has SeCoPa price them as exact rows
(:func:`embedding_rows`, :mod:`hipress.secopa.model.rowcost`), which records each one's
break-even count in ``plan.meta["row_prices"]``. Once a step's touched rows are counted (the
most over the ranks), :func:`decide_rows` makes the plan to run from then on with
:func:`plan_rows`: each embedding whose count is within its break-even count (or, unpriced,
whose bounds stay well below its rows) becomes row-sparse with a bound of twice that count.
A later step denser than the bound falls back to a dense step, so the result never depends on
the decision, only the bytes do.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from hipress.core.plan import Plan, PlanError, Strategy
from hipress.core.rule import Selection
from hipress.secopa.model.rowcost import RowDensity, row_bound

__all__ = ["candidates", "decide_rows", "embedding_rows", "plan_rows"]


def embedding_rows(
    selection: Selection, pairs: Sequence[tuple[str, tuple[int, ...] | None]]
) -> dict[str, RowDensity]:
    """What ``plan="auto"`` asks SeCoPa to price as rows: the 2-D parameters of ``pairs``
    (``(name, shape)``) that ``selection`` keeps plain as embeddings, as exact rows whose
    count is not known yet."""
    kept = selection.reasons(pairs)
    return {n: RowDensity(s[0], exact=True) for n, s in pairs
            if kept.get(n) == "embedding" and s is not None and len(s) == 2}  # fmt: skip


def plan_rows(
    plan: Plan,
    measured: Mapping[str, tuple[int, int]],
    world_size: int,
    *,
    slack: float = 2.0,
    max_fraction: float = 0.25,
) -> Plan:
    """``plan`` with each measured tensor row-sparse where that pays: its bound is
    ``ceil(slack * touched) + 1`` rows (at most its row count), and it is row-sparse when
    SeCoPa priced it (``plan.meta["row_prices"]``, :mod:`hipress.secopa.model.rowcost`) and
    ``touched`` is within its break-even count, or, for a tensor SeCoPa did not price, when
    ``world_size`` bounds stay within ``max_fraction`` of its rows (the union of the ranks'
    rows is then well below the dense tensor). The prices record ``touched`` and the choice.
    Other entries are kept as they are. Raises
    :class:`PlanError` naming a measured tensor the plan does not hold or whose rows do not
    divide its size."""
    if slack < 1 or not 0 < max_fraction <= 1:
        raise PlanError(f"plan_rows: slack must be >= 1 and 0 < max_fraction <= 1, got "
                        f"{slack}, {max_fraction}")  # fmt: skip
    entries = []
    prices = {n: dict(v) for n, v in dict(plan.meta.get("row_prices") or {}).items()}
    names = {e.name for e in plan.entries}
    unknown = sorted(set(measured) - names)
    if unknown:
        raise PlanError(f"plan_rows: the plan has no entry for measured tensors {unknown[:5]}")
    for e in plan.entries:
        if e.name not in measured:
            entries.append(e)
            continue
        rows, touched = measured[e.name]
        if rows <= 0 or e.numel % rows:
            raise PlanError(f"plan_rows: {e.name}: {rows} rows do not divide {e.numel} elements")
        bound = row_bound(touched, rows, slack)
        price = prices.get(e.name)
        if price is not None and isinstance(price.get("breakeven"), int):
            dense = touched > price["breakeven"]
            price.update(touched=touched, chosen="dense" if dense else "rows")
        else:
            dense = world_size * bound > max_fraction * rows
        if dense:
            entries.append(dataclasses.replace(e, rows=0, row_bound=0))
            continue
        strategy = Strategy.ALLGATHER if e.compress else Strategy.ALLREDUCE
        entries.append(dataclasses.replace(e, strategy=strategy, partitions=1, rows=rows,
                                           row_bound=bound))  # fmt: skip
    meta = {**dict(plan.meta), "row_sparse": {"slack": slack, "max_fraction": max_fraction}}
    if prices:
        meta["row_prices"] = prices
    return dataclasses.replace(plan, entries=tuple(entries), meta=meta)


def candidates(plan: Plan, shapes: Mapping[str, tuple[int, ...] | None]) -> dict[str, int]:
    """``name -> rows`` of the plan's entries kept plain as embeddings, 2-D, not yet rows."""
    kept: Mapping[str, str] = plan.meta.get("kept_plain", {}) or {}
    out = {}
    for e in plan.entries:
        shape = shapes.get(e.name)
        if (kept.get(e.name) == "embedding" and not e.compress and not e.row_bound
                and shape is not None and len(shape) == 2 and shape[0] > 1):  # fmt: skip
            out[e.name] = int(shape[0])
    return out


def decide_rows(
    plan: Plan, measured: Mapping[str, tuple[int, int]], world_size: int
) -> tuple[Plan, list[str], list[str]]:
    """The plan to run once ``measured`` (``name -> (rows, the most rows touched in a step
    on any rank)``) is known (:func:`plan_rows`), the names it makes row-sparse, and one line
    per measured tensor saying what was chosen and why (for the caller's log)."""
    new = plan_rows(plan, measured, world_size)
    chosen = sorted(e.name for e in new.entries if e.name in measured and e.row_bound)
    prices = new.meta.get("row_prices") or {}
    lines = []
    for name, (rows, most) in sorted(measured.items()):
        be = prices.get(name, {}).get("breakeven")
        why = (
            f"unpriced: rows while {world_size} bounds stay within a quarter of the rows"
            if be is None
            else f"SeCoPa's break-even: {be} rows"
        )
        what = "synchronised as rows from now on" if name in chosen else "kept dense"
        if most >= rows:
            what += (" (every row touched: a dense gradient, as a tied input/output embedding "
                     f"has; include=[{name!r}] compresses it)")  # fmt: skip
        lines.append(f"{name}: at most {most} of {rows} rows touched in a step on any rank: "
                     f"{what} ({why})")  # fmt: skip
    return new, chosen, lines
