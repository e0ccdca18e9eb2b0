"""Convergence under compression: the same data-parallel training job (a word-level LSTM LM or a
GPT-2-style transformer LM on the standard library's sources, or a tabular classifier; N
workers, a fixed number of epochs) run uncompressed and with every shipped algorithm (each with
its own error feedback, where it has one); accuracy on held-out data side by side, after the last epoch and at the best epoch (measured after every
epoch: with a long enough run the uncompressed baseline overfits, and its final accuracy alone
would flatter the others).

    results = run_convergence(ConvergenceOptions(workers=4, epochs=2))

The network does not change what is computed, so the workers talk over loopback. Every run starts
from the same weights and sees the same batches in the same order; only the gradient exchange
differs. With ``fsdp`` the model is sharded by FSDP2 instead of replicated by DDP, and the
algorithms compress its reduce-scatter (:mod:`~hipress.bench.convergence_fsdp`).
"""

from __future__ import annotations

import logging
import statistics
import time
from typing import Any

import torch

from hipress.bench.convergence_local import local_markdown, local_rows, time_to_loss
from hipress.bench.convergence_options import (
    TASKS,
    ConvergenceOptions,
    density_schedule,
    fsdp_refusal,
    own_momentum,
)
from hipress.bench.convergence_rows import (
    PROBE_STEPS,
    check_rows,
    loss_gaps,
    parse_row,
    row_names,
)
from hipress.bench.convergence_train import train_rank
from hipress.bench.diloco import Row
from hipress.bench.diloco_torchft import version
from hipress.bench.netsim import LoopbackNetwork, open_network, run_in_network
from hipress.bench.tables import convergence_rows
from hipress.bench.workloads import load_corpus, tabular_data

__all__ = [
    "ConvergenceOptions",
    "check_convergence",
    "convergence_markdown",
    "density_schedule",
    "own_momentum",
    "run_convergence",
    "summarise",
]

logger = logging.getLogger(__name__)

UNCOMPRESSED = "uncompressed"


def _has_ef(name: str) -> bool:
    from hipress.bench.powersgd_rows import NAMES
    from hipress.compll import load

    if name in NAMES:  # both PowerSGD rows keep error feedback
        return True
    return load(name, backend="reference").error_feedback


def check_convergence(opts: ConvergenceOptions) -> dict[str, str]:
    """Check what can be checked before training: in FSDP mode, every algorithm's feedback
    option, under DDP the row-sparse rows' algorithms. Returns algorithm entry -> resolved
    feedback option (empty under DDP); raises ValueError for an unknown algorithm or an
    option it cannot use."""
    if not opts.fsdp:
        check_rows(opts)
        return {}
    return {n: _fsdp_feedback(n, opts) for n in opts.resolved_algorithms()}


def _fsdp_feedback(entry: str, opts: ConvergenceOptions) -> str:
    """The feedback option ``entry`` ("name" or "name:feedback") runs with in FSDP mode,
    resolved; raises ValueError for an unknown algorithm or an option it cannot use."""
    from hipress.compll import CllError, load
    from hipress.fsdp import FsdpError
    from hipress.fsdp.feedback import resolve_feedback

    name, _, feedback = entry.partition(":")
    try:
        return resolve_feedback(load(name, backend="reference"), feedback or opts.fsdp_feedback)
    except (CllError, FsdpError) as exc:
        raise ValueError(f"{entry}: {exc}") from exc


def _task_data(opts: ConvergenceOptions) -> dict[str, Any]:
    if opts.task == "tabular":
        t = tabular_data(opts.train_samples, opts.eval_samples)
        return {
            "features": t.features, "classes": t.classes, "bayes": t.bayes,
            "train_x": t.train_x, "train_y": t.train_y,
            "valid_x": t.valid_x, "valid_y": t.valid_y,
        }  # fmt: skip
    corpus = load_corpus(opts.vocab, 1 << 20)
    return {
        "vocab": corpus.vocab_size,
        "train": corpus.train[: opts.train_tokens].clone(),
        "valid": corpus.valid[: opts.eval_tokens].clone(),
    }


def _spread(xs: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(xs),
        "min": min(xs),
        "max": max(xs),
        "std": statistics.stdev(xs) if len(xs) > 1 else 0.0,
    }


def summarise(rows: list[dict[str, Any]]) -> None:
    """Fill in each row's figures over its seeds (``runs``: one result per seed, in the order
    of the seeds) against the first row (uncompressed), in place: ``accuracy``,
    ``best_accuracy``, ``valid_loss``, ``seconds`` and ``steps`` (means), ``final`` and
    ``best`` (``mean``, ``min``, ``max``, ``std`` over the seeds, as fractions), ``best_epochs``
    (one per seed), ``delta_points`` and ``best_delta_points`` (the mean minus uncompressed's
    mean, in points, final against final and best against best) and ``delta_range`` and
    ``best_delta_range`` (the smallest and largest per-seed gap, each seed against
    uncompressed's same seed). A row any of whose seeds failed keeps ``error``."""
    for r in rows:
        runs = r["runs"]
        if "error" in r or not runs or any("accuracy" not in x for x in runs):
            continue
        finals = [x["accuracy"] for x in runs]
        bests = [x["best_accuracy"] for x in runs]
        r.update(
            accuracy=statistics.fmean(finals),
            best_accuracy=statistics.fmean(bests),
            final=_spread(finals),
            best=_spread(bests),
            best_epochs=[x["best_epoch"] for x in runs],
            valid_loss=statistics.fmean(x["valid_loss"] for x in runs),
            seconds=statistics.fmean(x["seconds"] for x in runs),
            steps=runs[0]["steps"],
            finite=all(x["finite"] for x in runs),
        )
    base = rows[0]
    if "accuracy" not in base:
        return
    for r in rows:
        if "accuracy" not in r:
            continue
        r["delta_points"] = 100 * (r["accuracy"] - base["accuracy"])
        r["best_delta_points"] = 100 * (r["best_accuracy"] - base["best_accuracy"])
        for key, field in (("delta_range", "accuracy"), ("best_delta_range", "best_accuracy")):
            gaps = [
                100 * (x[field] - b[field]) for x, b in zip(r["runs"], base["runs"], strict=True)
            ]
            r[key] = [min(gaps), max(gaps)]


def run_convergence(opts: ConvergenceOptions, progress: Any = None) -> dict[str, Any]:
    """Train uncompressed, then with each algorithm, once per seed; returns ``{"meta",
    "rows"}``. Each row has ``algorithm``, ``error_feedback``, ``runs`` (per seed:
    ``accuracy`` and ``valid_loss`` after the last epoch, ``epoch_accuracy`` and
    ``epoch_valid_loss`` after each epoch, ``best_accuracy``, ``best_epoch``, ``seconds``
    (training only), ...) and the summary over the seeds of :func:`summarise`, or ``error``."""
    names = [UNCOMPRESSED, *opts.resolved_algorithms(), *row_names(opts)]
    local = {r.variant: r for r in local_rows(opts)}
    feedback = check_convergence(opts)  # before hours of training
    data = _task_data(opts)
    with _network(opts) as net:
        rows = [_row(net, name, data, opts, feedback, local.get(name), progress)
                for name in [*names, *local]]  # fmt: skip
    summarise(rows)
    loss_gaps(rows, row_names(opts))
    if local:
        time_to_loss(rows, _window(local.values()))
    return {"meta": _meta(opts, data, net, local), "rows": rows}


def _network(opts: ConvergenceOptions) -> Any:
    if opts.rate_mbit is None:
        return LoopbackNetwork(opts.workers, "convergence does not depend on the network")
    return open_network(opts.workers, opts.rate_mbit)


def _window(rows: Any) -> int:
    """Steps of the trailing mean of :func:`time_to_loss`: at least one period of every row."""
    return max(8, *(r.h for r in rows))


def _row(net: Any, name: str, data: dict[str, Any], opts: ConvergenceOptions,
         feedback: dict[str, str], local: Row | None, progress: Any) -> dict[str, Any]:  # fmt: skip
    """One row: ``name`` (uncompressed, an algorithm or a local-step variant) over every seed."""
    rows, row_alg = parse_row(name, opts)
    alg = None if name == UNCOMPRESSED or local is not None else row_alg if rows else name
    row: dict[str, Any] = {
        "algorithm": name,
        "error_feedback": None if alg is None else _has_ef(alg.partition(":")[0]),
        "runs": [],
    }
    if local is not None and local.kind == "diloco" and local.algorithm is not None:
        from hipress.compll import load
        from hipress.diloco.coder import resolve_feedback

        alg_ = load(local.algorithm, backend="reference")
        row["error_feedback"] = resolve_feedback(alg_, "auto") != "none"  # DiLoCo's default
    if local is not None:
        row["local_steps"] = {"kind": local.kind, "h": local.h, "algorithm": local.algorithm,
                              "fragments": local.fragments, "delay": local.delay}  # fmt: skip
    if opts.fsdp and alg is not None:
        row["feedback"] = feedback[name]
        row["error_feedback"] = feedback[name] != "none"
        why = fsdp_refusal(name.partition(":")[0], opts)
        if why is not None:
            logger.error("convergence: %s refused: %s", name, why)
            row["error"] = why
            return row
    addresses = list(getattr(net, "addresses", ["127.0.0.1"] * opts.workers))
    for seed in opts.seeds:
        if progress is not None:
            progress(f"convergence | {opts.task} | {name} | seed {seed}")
        try:
            res = run_in_network(
                net, train_rank, data, alg, opts, seed, local=local, addresses=addresses,
                rows=rows, timeout=opts.timeout, threads=opts.threads,
            )  # fmt: skip
        except Exception as exc:  # one failing algorithm is a result, not a crash
            logger.error("convergence: %s (seed %d) failed: %s", name, seed, exc)
            row["error"] = str(exc)[-2000:]
            break
        run = {k: v for k, v in res[0].items() if k not in ("losses", "elapsed")}
        if opts.local_steps or opts.row_sparse:  # every rank's loss, the slowest rank's time
            run["loss_curve"] = [
                sum(x) / len(x) for x in zip(*(r["losses"] for r in res), strict=True)
            ]
            run["elapsed"] = [max(x) for x in zip(*(r["elapsed"] for r in res), strict=True)]
        row["runs"].append({"seed": seed, **run})
        if progress is not None:
            progress(
                f"    final {100 * res[0]['accuracy']:.2f}%, "
                f"best {100 * res[0]['best_accuracy']:.2f}%"
            )
    return row


def _meta(opts: ConvergenceOptions, data: dict[str, Any], net: Any,
          local: dict[str, Row]) -> dict[str, Any]:  # fmt: skip
    spec = TASKS[opts.task]
    meta = {
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "task_name": opts.task,
        "task": spec.description,
        **{k: v for k, v in vars(opts).items() if k not in ("algorithms", "task")},
        "seeds": list(opts.seeds),
        "batch": opts.batch or spec.batch,
        "bptt": opts.window() if spec.window else None,
        "lr": opts.lr or spec.lr,
        "clip": spec.clip if opts.clip is None else opts.clip,
    }
    if opts.momentum_handover:
        meta["momentum_handover"] = (
            "the optimizer's momentum until compression starts, then the algorithm's own "
            "(dgc), with the optimizer's buffer as its starting point, and updates clipped after "
            "momentum at clip / (1 - momentum); uncompressed parameters keep the optimizer's "
            "momentum"
        )
    if opts.task == "tabular":
        meta["bayes_accuracy"] = data["bayes"]
    meta["network"] = getattr(net, "label", "loopback")
    if local:
        meta["loss_window"] = _window(local.values())
        meta["torchft"] = version() or "not installed"
    return meta


def _setup_line(m: dict[str, Any]) -> str:
    if m.get("task_name") == "tabular":
        size = (
            f"{m['epochs']} epoch(s) over {m['train_samples']} samples, {m['batch']} per worker "
            f"per step; accuracy on {m['eval_samples']} held-out samples (the labelling rule "
            f"itself scores {100 * m.get('bayes_accuracy', float('nan')):.1f}%)"
        )
    else:
        size = (
            f"{m['epochs']} epoch(s) over {m['train_tokens']} tokens, {m['batch']} x "
            f"{m['bptt']}-token windows per worker per step; next-word accuracy on "
            f"{m['eval_tokens']} held-out tokens"
        )
    warm = f"{m.get('warmup_steps', 0)} step(s)"
    if m.get("warmup_epochs"):
        warm = f"{m['warmup_epochs']} epoch(s) + {warm}"
    head = (
        f"{m['task']}: {m['workers']} workers, {size}. SGD lr {m['lr']} "
        f"({m.get('lr_schedule', 'constant')}) momentum {m['momentum']}, clip {m['clip']}. "
    )
    if m.get("fsdp"):
        return head + (
            "FSDP2 (fully_shard), not DDP: uncompressed is plain FSDP2 (float32 "
            "reduce-scatter), each algorithm hipress.fsdp.register (error feedback "
            f"{m.get('fsdp_feedback', 'auto')} unless the row says otherwise; units under "
            f"65536 elements plain). Warm-up: {warm} uncompressed."
        )
    rows = (
        f" Rows ALGORITHM-rows: the default rule's plan with the embeddings sent as their "
        f"touched rows from the first step (hipress.casync.rowsparse.probe_plan over each "
        f"rank's first {PROBE_STEPS} batches); none-rows: lossless, the rest plain."
        if m.get("row_sparse")
        else ""
    )
    return head + (
        f"CaSync plan: {m['plan'] or 'default rule'}. CaSync warm-up: {warm} uncompressed. "
        f"Sparsifiers' density warm-up: {m.get('density_warmup_epochs', 0)} epoch(s).{rows}"
    )


def convergence_markdown(results: dict[str, Any]) -> str:
    """A markdown table of :func:`run_convergence`'s results."""
    m = results["meta"]
    seeds = m.get("seeds", [0])
    momentum = (
        "Momentum: the optimizer's until compression starts, then handed over to an algorithm "
        "with its own momentum correction (dgc), whose updates are then clipped after momentum "
        "at clip / (1 - momentum); parameters left uncompressed keep the optimizer's."
        if m.get("momentum_handover")
        else "An algorithm with its own momentum correction (dgc) runs with the optimizer's "
        "momentum at 0 (it replaces it)."
    )
    if m.get("fsdp"):
        momentum = (
            "Momentum: the optimizer's throughout. Algorithms that need CaSync's state (dgc's "
            "momentum hand-over, a sparsifier's density warm-up) run only under DDP."
        )
    out = [
        "# Convergence under compression" + (", FSDP2" if m.get("fsdp") else ""),
        "",
        f"{_setup_line(m)} {momentum} Seeds: {', '.join(map(str, seeds))}. {m['date']}. "
        f"Command: `{m.get('command', '?')}`",
        "",
        "Final: after the last epoch. Best: the best epoch's (validation accuracy is measured "
        "after every epoch, as one would pick the checkpoint to keep); each compared with "
        "uncompressed's own final or best.",
        "",
    ]
    out += convergence_rows(results)
    gaps = [r for r in results["rows"] if "loss_curve_max_abs_diff" in r]
    if gaps:
        out += ["", "Row-sparse rows against uncompressed, seed by seed (largest over the seeds): "
                "training loss per step (mean over ranks) and validation loss after each "
                "epoch:", "", "| row | steps identical | max abs diff, training loss | "
                "max abs diff, validation loss |", "|---|---:|---:|---:|",
                *(f"| {r['algorithm']} | {r['loss_curve_same_steps']} of {r['steps']} | "
                  f"{r['loss_curve_max_abs_diff']:.3g} | {r['valid_loss_max_abs_diff']:.3g} |"
                  for r in gaps)]  # fmt: skip
    local = local_markdown(results)
    if local:
        longer = (f" Local-step rows train {m['local_epochs']} epochs; losses at DDP's tokens."
                  if m.get("local_epochs") else "")  # fmt: skip
        out += ["", f"Training loss against DDP's (trailing mean over "
                f"{m.get('loss_window')} steps, all ranks), network: {m.get('network')}:{longer}",
                "", *local]  # fmt: skip
    return "\n".join(out) + "\n"
