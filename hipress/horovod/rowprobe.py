"""Embeddings as rows over Horovod, decided from their measured density.

The same decision as the DDP hook's (:mod:`hipress.casync.rowprobe`), with the same rule
(:mod:`hipress.codec.rowplan`): with the default rule or ``plan="auto"``, the embeddings the
plan keeps plain (:func:`~hipress.codec.rowplan.candidates`) have their touched rows counted
as their gradients start synchronising; at the end of the first ``synchronize()`` in which a
rank touched one of their rows, every rank takes the largest count over the ranks (one small
``allreduce(op=Max)``) and runs from the next step on the plan
:func:`~hipress.codec.rowplan.decide_rows` makes: the embeddings where rows pay (SeCoPa's
break-even count under ``"auto"``) travel as their rows, exactly. A step with no touched row
(``hvd.broadcast_optimizer_state``'s step on zero gradients) does not decide. A later step
denser than an entry's bound is synchronised densely (:mod:`hipress.horovod.rowsparse`), so the
gradients never depend on the decision, only the bytes do.

The decision (the counts it was taken from) is part of ``compression_state_dict()``;
loading one restores it, so a resumed run synchronises exactly as the saved one would have.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch

from hipress.codec.rowplan import candidates, decide_rows
from hipress.codec.rowsparse import nonzero_rows
from hipress.core.plan import Plan

__all__ = ["RowCounter", "parse_decision"]

log = logging.getLogger(__name__)


class RowCounter:
    """The touched rows of a plan's candidate embeddings, until the decision.

    Fields:
        rows: ``name -> rows`` of the candidates of the plan run before the decision.
        counting: whether rows are counted (the default rule or ``"auto"``) and not decided.
        touched: ``name -> the most rows touched in one step`` on this rank since the last
            ``synchronize()``.
        measured: ``name -> (rows, the most rows touched on any rank)`` the decision was
            taken from; None before.
    """

    def __init__(self, plan: Plan, shapes: Mapping[str, tuple[int, ...] | None], count: bool):
        self.rows = candidates(plan, shapes)
        self.count = bool(count) and bool(self.rows)
        self.touched: dict[str, int] = {}
        self.measured: dict[str, tuple[int, int]] | None = None

    @property
    def counting(self) -> bool:
        return self.count and self.measured is None

    def observe(self, name: str, grad: torch.Tensor) -> None:
        """Count the rows of ``grad`` (parameter ``name``'s, about to be synchronised) that
        hold a non-zero, while counting."""
        rows = self.rows.get(name)
        if rows is None or not self.counting:
            return
        n = int(nonzero_rows(grad.detach().reshape(rows, -1)).numel())
        self.touched[name] = max(n, self.touched.get(name, 0))

    def end_step(self, hvd: Any) -> dict[str, tuple[int, int]] | None:
        """A collective at the end of every ``synchronize()`` while counting: the counts'
        maximum over the ranks; returns them (and keeps them as :attr:`measured`) when a rank
        touched a row, else None (counting goes on)."""
        if not self.counting:
            return None
        names = sorted(self.rows)
        mine = torch.tensor([self.touched.get(n, 0) for n in names], dtype=torch.int64)
        self.touched.clear()
        most = hvd.allreduce(mine, op=hvd.Max, name="hipress.rows.count").tolist()
        if not any(most):
            return None
        self.measured = {n: (self.rows[n], int(c)) for n, c in zip(names, most, strict=True)}
        return self.measured

    def decide(self, base: Plan, world_size: int, rank: int) -> Plan:
        """The plan to run after :attr:`measured` (``base`` while undecided); logs the choice
        on rank 0."""
        if self.measured is None:
            return base
        plan, _, lines = decide_rows(base, self.measured, world_size)
        if rank == 0:
            for line in lines:
                log.info("hipress.horovod: %s", line)
        return plan

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: the counts the decision was taken from (None: undecided)."""
        m = self.measured
        return {"measured": None if m is None else {n: list(v) for n, v in sorted(m.items())}}


def parse_decision(
    saved: Any, rows: Mapping[str, int], where: str, error: type[Exception]
) -> dict[str, tuple[int, int]] | None:
    """The decision of a checkpoint's ``rows`` entry (:meth:`RowCounter.state_dict`; absent
    in a checkpoint of a plan without candidates: None), checked against the candidates
    ``rows`` (``name -> rows``) of the plan run; raises ``error`` naming what is wrong."""
    if saved is None:
        return None
    if not isinstance(saved, Mapping) or "measured" not in saved:
        raise error(f"{where}: damaged state dict: `rows` is not a row decision")
    m = saved["measured"]
    if m is None:
        return None
    ok = isinstance(m, Mapping) and all(
        isinstance(v, list | tuple) and len(v) == 2
        and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
        and 0 <= v[1] <= v[0]
        for v in m.values()
    )  # fmt: skip
    if not ok:
        raise error(f"{where}: damaged state dict: `rows.measured` must map names to "
                    "[rows, touched] with 0 <= touched <= rows")  # fmt: skip
    if set(m) != set(rows) or any(m[n][0] != rows[n] for n in rows):
        raise error(
            f"{where}: the state dict's row decision is for {sorted(m)}, this plan's "
            f"embeddings are {sorted(rows)} (with {dict(sorted(rows.items()))} rows); resume "
            "with the plan the checkpoint was saved with"
        )
    return {n: (int(v[0]), int(v[1])) for n, v in m.items()}
