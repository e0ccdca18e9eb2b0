"""Row-sparse plans: which tensors to synchronise as rows, from their measured density.

:func:`touched_rows` measures a probe step's gradients (how many rows of each 2-D gradient hold
a non-zero); :func:`plan_rows` turns a plan and those figures into a plan whose sparse enough
entries are row-sparse (:attr:`~hipress.core.plan.TensorPlan.row_bound`), exact where the
entry was uncompressed and compressed with the algorithm where it was compressed. The run
itself (:mod:`hipress.casync.strategies.rowsparse`) falls back to a dense step whenever a rank
touches more rows than the bound, so a bound measured on a few steps is safe, only slower
when it is too small.

    measured = touched_rows(model.named_parameters())      # after a probe step's backward
    plan = plan_rows(default_plan, measured, world_size)
    register(ddp, "onebit", plan=plan)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from hipress.core.plan import Plan, PlanError, Strategy

__all__ = ["plan_rows", "probe_plan", "touched_rows"]


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
    ``world_size`` bounds stay within ``max_fraction`` of its rows (the union of the ranks'
    rows is then well below the dense tensor). Other entries are kept as they are. Raises
    :class:`PlanError` naming a measured tensor the plan does not hold or whose rows do not
    divide its size."""
    if slack < 1 or not 0 < max_fraction <= 1:
        raise PlanError(f"plan_rows: slack must be >= 1 and 0 < max_fraction <= 1, got "
                        f"{slack}, {max_fraction}")  # fmt: skip
    entries = []
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
        if world_size * bound > max_fraction * rows:
            entries.append(dataclasses.replace(e, rows=0, row_bound=0))
            continue
        strategy = Strategy.ALLGATHER if e.compress else Strategy.ALLREDUCE
        entries.append(dataclasses.replace(e, strategy=strategy, partitions=1, rows=rows,
                                           row_bound=bound))  # fmt: skip
    meta = {**dict(plan.meta), "row_sparse": {"slack": slack, "max_fraction": max_fraction}}
    return dataclasses.replace(plan, entries=tuple(entries), meta=meta)


def probe_plan(
    model: torch.nn.Module,
    steps: Iterable[Callable[[torch.nn.Module], None]],
    algorithm: str | None,
    group: Any = None,
    **options: Any,
) -> Plan:
    """The default rule's plan for ``model`` under ``algorithm``, made row-sparse from a probe
    (:func:`plan_rows` with ``options``): each of ``steps`` runs one backward on ``model`` (not
    yet wrapped in DDP); the most rows any rank touched in one step decide. A collective over
    ``group``: every rank must call it. Leaves the gradients zero."""
    import torch.distributed as dist

    from hipress.casync.state import CaSyncState

    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    most: dict[str, tuple[int, int]] = {}
    for step in steps:
        model.zero_grad(set_to_none=False)
        step(model)
        for name, (rows, touched) in touched_rows(named).items():
            most[name] = (rows, max(touched, most.get(name, (rows, 0))[1]))
    model.zero_grad(set_to_none=False)
    names = sorted(most)
    counts = torch.tensor([most[n][1] for n in names], dtype=torch.int64)
    dist.all_reduce(counts, op=dist.ReduceOp.MAX, group=group)
    measured = {n: (most[n][0], int(c)) for n, c in zip(names, counts.tolist(), strict=True)}
    base = CaSyncState(algorithm, named_parameters=named, process_group=group, log_every=0).plan
    return plan_rows(base, measured, dist.get_world_size(group), **options)
