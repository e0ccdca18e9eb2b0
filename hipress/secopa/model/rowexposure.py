"""Row-sparse or dense, judged by the exposed time of the whole step.

:func:`~hipress.secopa.model.rowcost.choose_rows` compares a tensor's row price with its dense
time *alone*. With the gradients' ready times the planner judges by the step instead
(:class:`~hipress.secopa.model.exposure.Exposure`): a dense gradient ready early can hide its
link time behind the rest of backward, while the rows' scan, gather and scatter run on the
cores backward needs (exposed in full); the embedding ready last hides nothing. So a tensor is
row-sparse when the step with it as rows, every other tensor as planned, exposes strictly less
than the step with it dense, by more than the tie band; within the band (a close call) the
per-tensor verdict stands, and the tie is logged and recorded. Its break-even count (what
CaSync decides by once it has counted rows, :func:`hipress.casync.rowprobe.plan_rows`) is the
most rows one rank may touch for the rows' step to stay below the dense one's by more than the
tie band (a margin against run-to-run noise in the measured costs: a closer call is dense);
where even no row at all is within the band of dense, the break-even by the tensor's time
alone stands, logged and recorded as a tie.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from hipress.secopa.model.costmodel import CostModel, Member
from hipress.secopa.model.exposure import Exposure, Tolerance
from hipress.secopa.model.rowcost import RowDensity, price_rows

__all__ = ["rows_by_exposure"]

log = logging.getLogger(__name__)


def _row_member(
    model: CostModel, m: Member, rows: int, touched: int, compressed: bool, formula: str,
    slack: float,
) -> Member:  # fmt: skip
    p = price_rows(model, m.numel, rows, touched, compressed, slack)
    return Member(formula, m.numel, 1, (p.compute_ms, p.comm_ms))


def _breakeven(exposure: Exposure, cur: list[Member], i: int, dense_ms: float,
               make: Any, rows: int, band: float = 0.0) -> int | None:  # fmt: skip
    """The most touched rows with the step's exposed ms below ``dense_ms`` by more than
    ``band``; -1 if none (exposed time grows with the count: bisection); None when even no
    row at all is within ``band`` of ``dense_ms`` (a close call at any count)."""

    def ms(t: int) -> float:
        trial = list(cur)
        trial[i] = make(t)
        return exposure.of(trial)

    least = ms(0)
    if abs(least - dense_ms) <= band:
        return None
    dense_ms -= band
    if not least < dense_ms:
        return -1
    lo, hi = 0, rows
    if ms(hi) < dense_ms:
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ms(mid) < dense_ms else (lo, mid)
    return lo


def rows_by_exposure(
    exposure: Exposure,
    model: CostModel,
    names: Sequence[str],
    dense: Sequence[Member],
    chosen: Sequence[Member],
    densities: Mapping[str, RowDensity],
    prices: Mapping[str, dict[str, Any]],
    formulas: tuple[str, str],
    tol: Tolerance,
    slack: float = 2.0,
) -> list[Member]:
    """The members with each tensor of ``densities`` row-sparse or dense by the exposed step
    (module docstring). ``dense``: the members before any row choice; ``chosen``: after
    :func:`~hipress.secopa.model.rowcost.choose_rows` (its per-tensor verdicts); ``prices``:
    its record, updated in place (``objective``, ``breakeven`` by the step and
    ``breakeven_alone``, ``dense_exposed_ms``, ``rows_exposed_ms``, ``near_tie``);
    ``formulas``: the table's (plain allreduce, compressed all-gather) names."""
    index = {n: i for i, n in enumerate(names)}
    cur = list(chosen)
    for name in sorted(densities):
        d, rec, i = densities[name], prices[name], index[name]
        compressed = bool(rec["compressed"])
        formula = formulas[1] if compressed else formulas[0]
        base = dense[i]
        if not compressed and model.formula(base.formula).compressed:  # exact rows vs plain
            base = Member(formulas[0], base.numel, 1)

        def make(t: int, m: Member = base, d: RowDensity = d, c: bool = compressed,
                 f: str = formula) -> Member:  # fmt: skip
            return _row_member(model, m, d.rows, t, c, f, slack)

        trial = list(cur)
        trial[i] = base
        dense_ms = exposure.of(trial)
        rec["objective"] = "exposed step"
        rec["breakeven_alone"] = rec["breakeven"]
        be = _breakeven(exposure, cur, i, dense_ms, make, d.rows, tol.band(dense_ms))
        if be is None:  # a close call even at no row: the per-tensor verdict decides
            rec["near_tie"] = True
            log.info("plan: %s: as rows, even with no row touched, the step exposes within "
                     "the tie band of dense (%.3f ms): kept the break-even by its time alone "
                     "(%d rows)", name, dense_ms, rec["breakeven_alone"])  # fmt: skip
        rec["breakeven"] = rec["breakeven_alone"] if be is None else be
        rec["dense_exposed_ms"] = round(dense_ms, 6)
        if d.touched is None:
            continue
        trial[i] = make(d.touched)
        rows_ms = exposure.of(trial)
        rec["rows_exposed_ms"] = round(rows_ms, 6)
        alone = rec["chosen"] == "rows"
        if abs(rows_ms - dense_ms) <= tol.band(min(rows_ms, dense_ms)):
            win = alone
            rec["near_tie"] = True
            log.info("plan: %s: rows or dense expose %.3f / %.3f ms a step, within the tie "
                     "band: kept the per-tensor verdict (%s)", name, rows_ms, dense_ms,
                     rec["chosen"])  # fmt: skip
        else:
            win = rows_ms < dense_ms
        rec["chosen"] = "rows" if win else "dense"
        if win != alone:
            log.info("plan: %s: %s by the exposed step (%.3f ms as rows, %.3f dense), not "
                     "by its time alone", name, rec["chosen"], rows_ms, dense_ms)  # fmt: skip
        cur[i] = trial[i] if win else dense[i]
    return cur
