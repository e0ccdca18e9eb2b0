"""Convergence under compression: the same data-parallel training job (a word-level LSTM LM on
the standard library's sources, N workers, a fixed number of epochs) run uncompressed and with
every shipped algorithm (each with its own error feedback, where it has one); next-word accuracy
on held-out text side by side, after the last epoch and at the best epoch (measured after every
epoch: with a long enough run the uncompressed baseline overfits, and its final accuracy alone
would flatter the others).

    results = run_convergence(ConvergenceOptions(workers=4, epochs=2))

The network does not change what is computed, so the workers talk over loopback. Every run starts
from the same weights and sees the same batches in the same order; only the gradient exchange
differs.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from hipress.bench.models import LSTMLM, load_corpus
from hipress.bench.netsim import LoopbackNetwork, run_in_network
from hipress.bench.tables import convergence_rows

__all__ = ["ConvergenceOptions", "convergence_markdown", "run_convergence"]

logger = logging.getLogger(__name__)

UNCOMPRESSED = "uncompressed"


@dataclass(frozen=True)
class ConvergenceOptions:
    """The job: ``workers`` ranks, ``epochs`` passes over ``train_tokens`` tokens in windows of
    ``bptt``, ``batch`` windows per rank per step, SGD (``lr``, ``momentum``, gradient norm
    clipped to ``clip`` unless it is 0), a ``vocab``-word vocabulary; accuracy on ``eval_tokens`` held-out
    tokens. ``algorithms``: names, or ("all",) for every shipped one. ``plan``: CaSync's plan
    ("auto", a file, or None for its default rule); ``warmup_steps``: CaSync's uncompressed
    warm-up; ``density_warmup_epochs``: DGC's warm-up for every sparsifier, see
    :func:`density_schedule`."""

    workers: int = 4
    algorithms: tuple[str, ...] = ("all",)
    epochs: int = 2
    plan: str | None = None
    threads: int = 1
    batch: int = 8
    bptt: int = 32
    vocab: int = 8192
    train_tokens: int = 160_000
    eval_tokens: int = 16_384
    lr: float = 0.5
    momentum: float = 0.9
    clip: float = 1.0
    warmup_steps: int = 0
    density_warmup_epochs: int = 0
    timeout: float = 3600.0

    def resolved_algorithms(self) -> list[str]:
        """The algorithm names to run (``all`` expanded to every shipped algorithm)."""
        if self.algorithms == ("all",):
            from hipress.compll import algorithms

            return list(algorithms())
        return list(self.algorithms)


def _model(vocab: int) -> LSTMLM:
    torch.manual_seed(0)
    return LSTMLM(vocab, emb=128, hidden=256, layers=1, cutoffs=(1000, 4000))


def _windows(ids: torch.Tensor, bptt: int) -> torch.Tensor:
    n = (len(ids) - 1) // bptt
    return torch.stack([ids[i * bptt : i * bptt + bptt + 1] for i in range(n)])


@torch.no_grad()
def _evaluate(model: LSTMLM, windows: torch.Tensor) -> tuple[float, float]:
    model.eval()
    correct = total = 0
    loss_sum = 0.0
    for chunk in windows.split(64):
        x, y = chunk[:, :-1], chunk[:, 1:]
        correct += int((model.predict(x) == y).sum())
        loss_sum += float(model(x, y)) * y.numel()
        total += y.numel()
    model.train()
    return correct / total, loss_sum / total


def _train(
    rank: int,
    world_size: int,
    data: dict[str, Any],
    algorithm: str | None,
    opts: ConvergenceOptions,
) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = _model(data["vocab"])
    ddp = DDP(model)
    train = _windows(data["train"], opts.bptt)
    per_step = world_size * opts.batch
    steps_per_epoch = len(train) // per_step
    if algorithm is not None:
        import hipress.casync

        hipress.casync.register(
            ddp,
            algorithm=algorithm,
            plan=opts.plan,
            warmup_steps=opts.warmup_steps,
            params_schedule=density_schedule(
                algorithm, opts.density_warmup_epochs, steps_per_epoch
            ),
        )
    # an algorithm with its own momentum correction (DGC) replaces the optimizer's momentum
    momentum = 0.0 if algorithm is not None and _own_momentum(algorithm) else opts.momentum
    opt = torch.optim.SGD(ddp.parameters(), lr=opts.lr, momentum=momentum)
    losses: list[float] = []
    valid = _windows(data["valid"], opts.bptt)
    curve: list[tuple[float, float]] = []  # rank 0: (accuracy, loss) after each epoch
    t0, t_eval = time.perf_counter(), 0.0
    for epoch in range(opts.epochs):
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(epoch))
        for s in range(steps_per_epoch):
            idx = order[s * per_step : (s + 1) * per_step][rank::world_size]
            chunk = train[idx]
            loss = ddp(chunk[:, :-1], chunk[:, 1:])
            opt.zero_grad(set_to_none=False)
            loss.backward()
            if opts.clip > 0:
                torch.nn.utils.clip_grad_norm_(ddp.parameters(), opts.clip)
            opt.step()
            losses.append(float(loss.detach()))
        if rank == 0:  # the others wait in the next step's first collective
            t = time.perf_counter()
            curve.append(_evaluate(model, valid))
            t_eval += time.perf_counter() - t
    seconds = time.perf_counter() - t0 - t_eval
    dist.barrier()
    out: dict[str, Any] = {
        "seconds": seconds,
        "steps": len(losses),
        "train_loss": losses[-1],
        "optimizer_momentum": momentum,
    }
    if rank == 0:
        acc, vloss = curve[-1]
        best = max(range(len(curve)), key=lambda e: curve[e][0])
        out.update(
            accuracy=acc,
            valid_loss=vloss,
            epoch_accuracy=[a for a, _ in curve],
            epoch_valid_loss=[v for _, v in curve],
            best_accuracy=curve[best][0],
            best_epoch=best + 1,
        )
        finite = all(torch.isfinite(p).all() for p in model.parameters())
        out["finite"] = bool(finite)
    return out


# a sparsifier's parameter: name -> (density -> value)
_DENSITY_PARAMS = {
    "s_percent": lambda d: d,
    "ratio": lambda d: d,
    "drop_ratio": lambda d: 1.0 - d,
}


def density_schedule(
    name: str, epochs: int, steps_per_epoch: int
) -> list[tuple[int, dict[str, float]]]:
    """DGC's warm-up (Lin et al. 2018) for sparsifier ``name`` as a CaSync ``params_schedule``:
    in epoch e < ``epochs`` it sends a fraction ``max(own, 0.25 / 4**e)`` of the elements
    (75%, 93.75%, 98.4375%, 99.6% sparsity ...), from epoch ``epochs`` on its own fraction.
    Empty for an algorithm without a fraction parameter (``s_percent``, ``ratio``,
    ``drop_ratio``) or with ``epochs`` 0."""
    from hipress.compll import load

    params = load(name, backend="reference").params
    key = next((k for k in _DENSITY_PARAMS if k in params), None)
    if key is None or epochs <= 0:
        return []
    to_value = _DENSITY_PARAMS[key]
    own = float(params[key]) if key != "drop_ratio" else 1.0 - float(params[key])
    schedule: list[tuple[int, dict[str, float]]] = []
    for e in range(epochs + 1):
        value = to_value(max(own, 0.25 / 4**e) if e < epochs else own)
        if not schedule or schedule[-1][1][key] != value:  # no entry that changes nothing
            schedule.append((e * steps_per_epoch, {key: value}))
    return schedule


def _own_momentum(name: str) -> bool:
    """Whether algorithm ``name`` keeps a momentum of its own (a ``momentum`` parameter > 0)."""
    from hipress.compll import load

    return float(load(name, backend="reference").params.get("momentum", 0.0)) > 0.0


def _has_ef(name: str) -> bool:
    from hipress.compll import load

    return load(name, backend="reference").error_feedback


def run_convergence(opts: ConvergenceOptions, progress: Any = None) -> dict[str, Any]:
    """Train uncompressed, then with each algorithm; returns ``{"meta", "rows"}`` where each row
    has ``algorithm``, ``error_feedback``, ``accuracy`` and ``valid_loss`` (after the last epoch),
    ``epoch_accuracy`` and ``epoch_valid_loss`` (after each epoch), ``best_accuracy`` and
    ``best_epoch``, ``delta_points`` and ``best_delta_points`` (final and best accuracy minus
    uncompressed's, in points) and ``seconds`` (training only), or ``error``."""
    corpus = load_corpus(opts.vocab, 1 << 20)
    data = {
        "vocab": corpus.vocab_size,
        "train": corpus.train[: opts.train_tokens].clone(),
        "valid": corpus.valid[: opts.eval_tokens].clone(),
    }
    net = LoopbackNetwork(opts.workers, "convergence does not depend on the network")
    rows: list[dict[str, Any]] = []
    for name in [UNCOMPRESSED, *opts.resolved_algorithms()]:
        if progress is not None:
            progress(f"convergence | {name}")
        alg = None if name == UNCOMPRESSED else name
        row: dict[str, Any] = {
            "algorithm": name,
            "error_feedback": None if alg is None else _has_ef(alg),
        }
        try:
            res = run_in_network(
                net, _train, data, alg, opts, timeout=opts.timeout, threads=opts.threads
            )
            row.update(res[0])
        except Exception as exc:  # one failing algorithm is a result, not a crash
            logger.error("convergence: %s failed: %s", name, exc)
            row["error"] = str(exc)[-2000:]
        rows.append(row)
        if progress is not None and "accuracy" in row:
            progress(f"    accuracy {100 * row['accuracy']:.2f}%")
    base, base_best = rows[0].get("accuracy"), rows[0].get("best_accuracy")
    for r in rows:
        if base is not None and "accuracy" in r:
            r["delta_points"] = 100 * (r["accuracy"] - base)
            r["best_delta_points"] = 100 * (r["best_accuracy"] - base_best)
    meta = {
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "task": "word-level LSTM LM (adaptive softmax) on Python stdlib sources",
        **{k: v for k, v in vars(opts).items() if k != "algorithms"},
    }
    return {"meta": meta, "rows": rows}


def convergence_markdown(results: dict[str, Any]) -> str:
    """A markdown table of :func:`run_convergence`'s results."""
    m = results["meta"]
    out = [
        "# Convergence under compression",
        "",
        f"{m['task']}: {m['workers']} workers, {m['epochs']} epoch(s) over {m['train_tokens']} "
        f"tokens, {m['batch']} x {m['bptt']}-token windows per worker per step, SGD lr "
        f"{m['lr']} momentum {m['momentum']}, clip {m['clip']}; next-word accuracy on "
        f"{m['eval_tokens']} held-out tokens. CaSync plan: {m['plan'] or 'default rule'}. "
        f"CaSync warm-up: {m.get('warmup_steps', 0)} uncompressed step(s). "
        f"Sparsifiers' density warm-up: {m.get('density_warmup_epochs', 0)} epoch(s). "
        "An algorithm with its own momentum correction (dgc) runs with the optimizer's momentum "
        f"at 0 (it replaces it). {m['date']}. Command: `{m.get('command', '?')}`",
        "",
        "Final: after the last epoch. Best: the best epoch's (validation accuracy is measured "
        "after every epoch, as one would pick the checkpoint to keep); each compared with "
        "uncompressed's own final or best.",
        "",
    ]
    out += convergence_rows(results)
    return "\n".join(out) + "\n"
