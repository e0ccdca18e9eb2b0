"""Row-sparse embeddings without a probe of your own (:class:`RowProbe`).

The default rule and ``plan="auto"`` keep embedding weights away from lossy codecs. Their
gradients are still mostly zero rows (only the rows of the batch's tokens are touched), so
they can travel exactly as rows (:mod:`hipress.casync.strategies.rowsparse`). A state made
with one of those plans counts, in its first step, how many rows of each such embedding's
gradient hold a non-zero; at the start of the next step every rank takes the largest count
over the group (one small all-reduce) and the embeddings where rows pay
(:func:`plan_rows`) are synchronised as rows from then on, exactly.
A later step denser than the bound falls back to a dense all-reduce for that step, so the
result never changes, only the bytes. A plan given explicitly (a file or a ``Plan``) is run
as it is: make it row-sparse with :func:`~hipress.casync.rowsparse.probe_plan`.

:func:`touched_rows` (a step's touched rows per 2-D gradient) and :func:`plan_rows` (a plan
with the sparse enough entries as rows) are the measure and the rule both paths share.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from hipress.casync.verdict import replan
from hipress.codec.logs import RANK_FILTER
from hipress.codec.rowsparse import row_states
from hipress.core.plan import Plan, PlanError, Strategy

__all__ = ["RowProbe", "candidates", "decide", "plan_rows", "touched_rows"]

log = logging.getLogger(__name__)
log.addFilter(RANK_FILTER)


def touched_rows(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, tuple[int, int]]:
    """``name -> (rows, touched)`` of every 2-D parameter with a gradient: its row count and
    how many rows of its gradient hold a non-zero (pass the largest over a few steps)."""
    out = {}
    for name, p in named:
        g = p.grad
        if g is not None and g.dim() == 2 and not g.is_sparse:
            out[name] = (g.shape[0], int(g.ne(0).any(1).sum()))
    return out


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
        bound = min(rows, math.ceil(slack * touched) + 1)
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


@dataclasses.dataclass
class RowProbe:
    """The one row count of a state's embeddings (see the module docstring).

    Fields:
        enabled: whether the state's plan came from the default rule or ``"auto"``.
        at_step: the step at whose start the decision is taken (the first step after
            ``warmup_steps``); None once taken.
        rows: ``name -> rows`` of the candidates (filled at the first observed bucket).
        touched: ``name -> the most rows touched in one observed step`` on this rank.
    """

    enabled: bool
    at_step: int | None
    rows: dict[str, int] | None = None
    touched: dict[str, int] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, plan_arg: Any, warmup_steps: int) -> RowProbe:
        """The probe of a state made with ``plan_arg`` (None, "default", "auto" count)."""
        implicit = plan_arg is None or (
            isinstance(plan_arg, str) and plan_arg in ("default", "auto")
        )
        return cls(implicit, warmup_steps + 1)

    def observe(self, state: Any, rt: Any, buffer: torch.Tensor, names: Sequence[str]) -> None:
        """Count the touched rows of the candidates in a bucket's flat ``buffer`` (the
        gradients of ``names`` in order) during the steps before :attr:`at_step`."""
        if not self.enabled or self.at_step is None or rt.engine.step >= self.at_step:
            return
        if self.rows is None:
            self.rows = candidates(rt.plan, dict(state._shapes))
        if not self.rows:
            return
        numels = dict(state._numels)
        offset = 0
        for name in names:
            n = numels[name]
            rows = self.rows.get(name)
            if rows is not None:
                g = buffer[offset : offset + n].view(rows, n // rows)
                count = int(g.ne(0).any(1).sum())
                self.touched[name] = max(count, self.touched.get(name, 0))
            offset += n

    def due(self, step: int) -> bool:
        """Whether the decision is taken at the start of step ``step`` (once; a state
        resumed past it never decides)."""
        if not self.enabled or self.at_step is None or step < self.at_step:
            return False
        due = step == self.at_step and bool(self.rows)
        self.at_step = None
        return due


def decide(state: Any, rt: Any, device: torch.device) -> Any:
    """Take ``state``'s row decision on runtime ``rt`` (a collective at the start of a step,
    on every rank); return the runtime to run the step with: ``rt``, or one whose plan holds
    the row-sparse embeddings (every algorithm state carried over, the step count too)."""
    probe: RowProbe = state._rows
    assert probe.rows is not None
    names = sorted(probe.rows)
    counts = torch.tensor([probe.touched.get(n, probe.rows[n]) for n in names], dtype=torch.int64)
    counts = counts.to(device)
    dist.all_reduce(counts, op=dist.ReduceOp.MAX, group=state.process_group)
    measured = {n: (probe.rows[n], int(c)) for n, c in zip(names, counts.cpu().tolist(),
                                                          strict=True)}  # fmt: skip
    plan = plan_rows(rt.plan, measured, state.world_size)
    chosen = [e for e in plan.entries if e.name in measured and e.row_bound]
    prices = plan.meta.get("row_prices") or {}
    for name, (rows, most) in measured.items():
        be = prices.get(name, {}).get("breakeven")
        why = "too many rows" if be is None else f"SeCoPa's break-even: {be} rows"
        log.info("casync: %s: at most %d of %d rows touched in a step on any rank: %s (%s)",
                 name, most, rows, "synchronised as rows from now on" if any(
                     e.name == name for e in chosen) else "kept dense", why)  # fmt: skip
    if not chosen:  # (the plan run now still records the count and the choice)
        rt.plan = dataclasses.replace(rt.plan, meta=plan.meta)
        return rt
    base = plan_rows(rt.base_plan, measured, state.world_size)
    worker = {**rt.worker_states, **row_states(plan, state.rank, state.seed, state._devices)}
    return replan(state, rt, plan, base, states=(worker, rt.server_states))
