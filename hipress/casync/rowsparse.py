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

from collections.abc import Callable, Iterable
from typing import Any

import torch

from hipress.casync.rowprobe import plan_rows, touched_rows
from hipress.core.plan import Plan

__all__ = ["plan_rows", "probe_plan", "touched_rows"]


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
