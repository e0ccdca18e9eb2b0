"""Row-sparse rows of ``hipress bench convergence`` (``--rows``): the same job with the
embeddings synchronised as their touched rows from the first step, as ``hipress bench e2e``'s
``hipress-ALGORITHM-rows`` rows run it. The plan is the one the e2e run uses,
:func:`hipress.casync.rowsparse.probe_plan` over a probe of the rank's first training batches;
``none`` is the lossless mode (touched rows sent exactly, every other tensor plain), whose
result equals uncompressed DDP's up to the order of float summation. Each row also reports how
far its training-loss curve and validation losses are from uncompressed's, seed by seed
(:func:`loss_gaps`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from hipress.bench.convergence_options import ConvergenceOptions
    from hipress.casync import CaSyncState
    from hipress.core.plan import Plan

__all__ = [
    "LOSSLESS",
    "PROBE_STEPS",
    "SUFFIX",
    "check_rows",
    "loss_gaps",
    "parse_row",
    "probed_plan",
    "row_entries",
    "row_names",
]

SUFFIX = "-rows"
LOSSLESS = "none"  # the algorithm entry of the lossless mode
PROBE_STEPS = 3  # batches the probe measures, as bench e2e's


def row_names(opts: ConvergenceOptions) -> list[str]:
    """The result rows of ``opts.row_sparse``: ``ALGORITHM-rows`` each (``none-rows``)."""
    return [f"{a}{SUFFIX}" for a in opts.row_sparse]


def parse_row(name: str, opts: ConvergenceOptions) -> tuple[bool, str | None]:
    """Whether ``name`` is one of ``opts``' row-sparse rows, and its algorithm (None for
    the lossless mode)."""
    if name not in row_names(opts):
        return False, None
    alg = name[: -len(SUFFIX)]
    return True, None if alg == LOSSLESS else alg


def check_rows(opts: ConvergenceOptions) -> None:
    """Raise ValueError for a ``row_sparse`` entry that cannot run: an unknown algorithm, or
    one with a momentum of its own (its momentum is handed over through the dense layout,
    which a row-sparse entry does not have)."""
    from hipress.bench.convergence_options import own_momentum
    from hipress.compll import CllError, load

    for alg in opts.row_sparse:
        if alg == LOSSLESS:
            continue
        try:
            load(alg, backend="reference")
        except CllError as exc:
            raise ValueError(f"--rows {alg}: {exc}") from exc
        if own_momentum(alg):
            raise ValueError(
                f"--rows {alg}: {alg} keeps a momentum of its own, handed over from the "
                "optimizer through CaSync's dense layout, which row-sparse entries do not have; "
                "leave it out of --rows"
            )


def probed_plan(
    model: nn.Module,
    algorithm: str | None,
    batches: list[torch.Tensor],
    loss: Callable[[nn.Module, torch.Tensor], torch.Tensor],
) -> Plan:
    """The e2e rows' plan for ``model`` (not yet wrapped in DDP) under ``algorithm`` (None:
    lossless): :func:`~hipress.casync.rowsparse.probe_plan` over one backward of each of
    ``batches``. A collective: every rank calls it. Leaves the gradients zero and the RNG
    where it was, so training starts as it would without the probe."""
    from hipress.casync.rowsparse import probe_plan

    steps = [lambda m, b=b: loss(m, b).backward() for b in batches]
    with torch.random.fork_rng(devices=[]):
        return probe_plan(model, steps, algorithm)


def row_entries(state: CaSyncState) -> dict[str, list[int]]:
    """``name -> [rows, row_bound]`` of the plan's row-sparse entries."""
    return {e.name: [e.rows, e.row_bound] for e in state.plan.entries if e.row_bound}


def loss_gaps(rows: list[dict[str, Any]], names: list[str]) -> None:
    """Add to each row in ``names``, in place, how far it is from the first row (uncompressed)
    seed by seed: ``loss_curve_max_abs_diff`` (the largest gap of the per-step training loss,
    mean over ranks) and ``valid_loss_max_abs_diff`` (of the validation loss after each
    epoch), the largest over the seeds, and ``loss_curve_same_steps``: the fewest leading steps
    whose training losses are identical, over the seeds."""
    base = {x["seed"]: x for x in rows[0]["runs"]}
    for r in rows:
        if r["algorithm"] not in names or "error" in r or not r["runs"]:
            continue
        curve = valid = 0.0
        same = None
        for x in r["runs"]:
            b = base.get(x["seed"])
            if b is None or "loss_curve" not in b or "epoch_valid_loss" not in b:
                break
            curve = max(curve, _gap(x["loss_curve"], b["loss_curve"]))
            valid = max(valid, _gap(x["epoch_valid_loss"], b["epoch_valid_loss"]))
            lead = next((i for i, (p, q) in enumerate(zip(x["loss_curve"], b["loss_curve"],
                                                          strict=True)) if p != q),
                        len(x["loss_curve"]))  # fmt: skip
            same = lead if same is None else min(same, lead)
        else:
            r["loss_curve_max_abs_diff"] = curve
            r["valid_loss_max_abs_diff"] = valid
            r["loss_curve_same_steps"] = same


def _gap(xs: list[float], ys: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(xs, ys, strict=True))
