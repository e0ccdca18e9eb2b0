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
with the sparse enough entries as rows) are the measure and the rule both paths share; the rule
and the decision (:mod:`hipress.codec.rowplan`) are the Horovod wrapper's too.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from hipress.casync.verdict import replan
from hipress.codec.logs import RANK_FILTER
from hipress.codec.rowplan import candidates, decide_rows, plan_rows
from hipress.codec.rowsparse import nonzero_rows, row_states

__all__ = ["RowProbe", "candidates", "decide", "plan_rows", "touched_rows"]

log = logging.getLogger(__name__)
log.addFilter(RANK_FILTER)


def touched_rows(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, tuple[int, int]]:
    """``name -> (rows, touched)`` of every 2-D parameter with a gradient: its row count and
    how many rows of its gradient hold a non-zero bit, as the row-sparse sync reads them
    (:func:`~hipress.codec.rowsparse.nonzero_rows`; pass the largest over a few steps)."""
    out = {}
    for name, p in named:
        g = p.grad
        if g is not None and g.dim() == 2 and not g.is_sparse:
            out[name] = (g.shape[0], int(nonzero_rows(g).numel()))
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
                count = int(nonzero_rows(g).numel())
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
    plan, chosen, lines = decide_rows(rt.plan, measured, state.world_size)
    for line in lines:
        log.info("casync: %s", line)
    if not chosen:  # (the plan run now still records the count and the choice)
        rt.plan = dataclasses.replace(rt.plan, meta=plan.meta)
        return rt
    base = plan_rows(rt.base_plan, measured, state.world_size)
    worker = {**rt.worker_states, **row_states(plan, state.rank, state.seed, state._devices)}
    return replan(state, rt, plan, base, states=(worker, rt.server_states))
