"""The local-step modes of ``hipress bench convergence`` (:mod:`~hipress.bench.convergence`):
the same job (same weights, batches, learning rate, momentum and clipping) trained by hipress's
DiLoCo, uncompressed DiLoCo, PyTorch's post-local SGD or torchft's DiLoCo, as named by
:func:`hipress.bench.diloco.parse_variants` (``diloco-onebit-h16``, ``postlocal-h16``, ...).

Each worker's inner optimizer is the job's SGD with momentum (its own buffer, kept local); the
outer step is the variant's. A worker's weights are its own between syncs; after an epoch whose
step count is a whole number of periods (one fragment, no delay) they are the global weights,
which rank 0 evaluates as the DDP job's.

Against DDP (the ``uncompressed`` row) each row gets its loss and accuracy at equal tokens (the
job's usual figures) and, from every rank's training loss and elapsed training time after each
step, the time it took to reach DDP's final training loss (:func:`time_to_loss`: trailing means
over ``window`` steps, so one lucky batch does not count). The time is the network's: with
``rate_mbit`` set the job runs on the shaped link (:mod:`hipress.bench.netsim`).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from hipress.bench import diloco
from hipress.bench.convergence_options import ConvergenceOptions

__all__ = ["local_markdown", "local_rows", "setup_local", "time_to_loss"]


def local_rows(opts: ConvergenceOptions) -> list[diloco.Row]:
    """The rows ``opts.local_steps`` names (``hH`` with each algorithm named in
    ``opts.algorithms``); ValueError for a variant that is not one."""
    named = tuple(a for a in opts.algorithms if a != "all")
    return diloco.parse_variants(opts.local_steps, named)


def setup_local(model: nn.Module, row: diloco.Row, opts: ConvergenceOptions, lr: float,
                rank: int, world: int, addresses: list[str] | None
                ) -> tuple[nn.Module, Any, contextlib.AbstractContextManager[Any]]:  # fmt: skip
    """``model`` trained as ``row`` says, with SGD (``lr``, the job's momentum) as the inner
    optimizer: (module to call, optimizer to step, the context to train in)."""
    inner = torch.optim.SGD(model.parameters(), lr=lr, momentum=opts.momentum)
    where = addresses or ["127.0.0.1"] * world
    module, opt, _, ctx = diloco.wrap(model, row, inner, rank, world, where)
    return module, opt, ctx


def _trailing(losses: list[float], window: int) -> list[float]:
    out, acc = [], 0.0
    for i, x in enumerate(losses):
        acc += x - (losses[i - window] if i >= window else 0.0)
        out.append(acc / min(i + 1, window))
    return out


def time_to_loss(rows: list[dict[str, Any]], window: int) -> None:
    """Fill in, in place, each row's ``time_to_ddp_loss_s`` (the first elapsed training time at
    which the trailing mean of its training loss over ``window`` steps, all ranks averaged, is
    at or below DDP's final one: the first row's), ``time_vs_ddp`` (that over DDP's own),
    ``steps_vs_ddp`` (the steps it took over DDP's: above 1 only for a row trained longer, see
    ``local_epochs``) and ``final_train_loss`` (the trailing mean at DDP's last step: equal
    tokens); None where it never gets there. Seed 0's run of each row; with several seeds also
    ``time_vs_ddp_seeds``, each seed's ratio against DDP's run with the same seed."""
    seeds = min((len(r.get("runs") or []) for r in rows), default=0)
    for j in range(seeds):
        for r, got in zip(rows, _seed_times(rows, j, window), strict=True):
            if got is None:
                continue
            if j == 0:
                r.update(got)
            if seeds > 1:
                r.setdefault("time_vs_ddp_seeds", []).append(got["time_vs_ddp"])


def _seed_times(rows: list[dict[str, Any]], j: int, window: int) -> list[dict[str, Any] | None]:
    """Per row, seed ``j``'s figures under :func:`time_to_loss`'s keys; None for a row (every
    row, when DDP's has none) without a loss curve."""

    def curve(r: dict[str, Any]) -> tuple[list[float], list[float]] | None:
        run = (r.get("runs") or [{}])[j]
        if "loss_curve" not in run:
            return None
        return _trailing(run["loss_curve"], window), run["elapsed"]

    base = curve(rows[0]) if rows else None
    if base is None:
        return [None] * len(rows)
    target, steps = base[0][-1], len(base[0])
    out: list[dict[str, Any] | None] = []
    for r in rows:
        c = curve(r)
        if c is None:
            out.append(None)
            continue
        hit = next(((k, t) for k, (m, t) in enumerate(zip(*c, strict=True)) if m <= target),
                   None)  # fmt: skip
        out.append({"ddp_final_train_loss": target,
                    "final_train_loss": c[0][min(steps, len(c[0])) - 1],
                    "time_to_ddp_loss_s": None if hit is None else hit[1],
                    "steps_vs_ddp": None if hit is None else (hit[0] + 1) / steps})  # fmt: skip
    ddp = out[0]["time_to_ddp_loss_s"] if out[0] else None
    for got in out:
        if got is not None:
            t = got["time_to_ddp_loss_s"]
            got["time_vs_ddp"] = None if t is None or not ddp else t / ddp
    return out


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _spread(ratios: list[Any] | None) -> str:
    """Mean (min-max) of the seeds' ratios; "-" unless every seed got there."""
    if not ratios or any(x is None for x in ratios):
        return "-"
    return f"{sum(ratios) / len(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"


def local_markdown(results: dict[str, Any]) -> list[str]:
    """Every row's training loss against DDP's and its time to DDP's final loss (empty when no
    row has a loss curve); with several seeds, each seed's ratio to DDP's time as well."""
    rows = [r for r in results["rows"] if "final_train_loss" in r]
    if not rows:
        return []
    seeds = any("time_vs_ddp_seeds" in r for r in rows)
    extra = " x DDP's, seeds mean (min-max) |" if seeds else ""
    out = [
        "| row | valid loss | vs DDP % | train loss | s to DDP's final train loss | x DDP's "
        f"| steps x DDP's |{extra}",
        "|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if seeds else ""),
    ]
    base = rows[0].get("valid_loss")
    for r in rows:
        v = r.get("valid_loss")
        pct = None if v is None or not base else 100 * (v - base) / base
        out.append(
            f"| {r['algorithm']} | {_fmt(v, '.3f')} | {_fmt(pct, '+.1f')} | "
            f"{_fmt(r.get('final_train_loss'), '.3f')} | {_fmt(r.get('time_to_ddp_loss_s'), '.1f')}"
            f" | {_fmt(r.get('time_vs_ddp'), '.2f')} | {_fmt(r.get('steps_vs_ddp'), '.2f')} |"
            + (f" {_spread(r.get('time_vs_ddp_seeds'))} |" if seeds else "")
        )
    return out
