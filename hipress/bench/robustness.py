"""Robustness to the optimizer a user already has: every shipped algorithm, with its default
parameters and CaSync's default plan, trains a small job with SGD + momentum and with AdamW,
without gradient clipping, next to plain DDP with the same optimizer; the eval loss of each
(algorithm, optimizer) cell against DDP's, or the message with which CaSync refused the cell.

    results = run_robustness(RobustnessOptions(task="mlp", steps=600))

Two tasks: ``mlp``, a 64 -> 2048 -> 10 MLP on a synthetic linear classification task (its first
weight, 131072 elements, is the tensor the default rule compresses), and ``lm``, the word-level
LSTM LM of :mod:`hipress.bench.workloads` on the standard library's sources. All cells of a run share
one launch of the worker processes (they run one after the other, each from the same weights on
the same batches); the workers talk over loopback, since the network changes nothing computed.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = [
    "DDP",
    "OPTIMIZERS",
    "RobustnessOptions",
    "robustness_markdown",
    "run_cells",
    "run_robustness",
    "verdict",
]

logger = logging.getLogger(__name__)

DDP = "ddp"
OPTIMIZERS = ("sgd", "adamw")


@dataclass(frozen=True)
class RobustnessOptions:
    """The job: ``workers`` ranks, ``steps`` optimizer steps of ``batch`` samples per rank.

    ``task``: "mlp" (``features`` -> ``hidden`` -> ``classes`` on a synthetic linear task) or
    "lm" (the LSTM LM with a ``vocab``-word vocabulary, ``batch`` windows of ``bptt`` tokens).
    ``optimizers``: "sgd" (SGD, ``sgd_lr``, ``momentum``) and/or "adamw" (AdamW, ``adamw_lr``,
    its default betas and weight decay). ``algorithms``: names, or ("all",) for every shipped
    one, each with its default parameters unless ``params`` (name -> parameters) says
    otherwise; ``backend``: CompLL's. A cell passes when its eval loss is at most
    (1 + ``tolerance``) times DDP's, or when CaSync refused it."""

    workers: int = 2
    task: str = "mlp"
    algorithms: tuple[str, ...] = ("all",)
    optimizers: tuple[str, ...] = OPTIMIZERS
    steps: int = 600
    batch: int = 32
    features: int = 64
    hidden: int = 2048
    classes: int = 10
    vocab: int = 8192
    bptt: int = 32
    sgd_lr: float = 0.05
    momentum: float = 0.9
    adamw_lr: float = 1e-3
    eval_size: int = 4096
    tolerance: float = 0.10
    threads: int = 1
    timeout: float = 3600.0
    backend: str = "auto"
    params: dict[str, dict[str, Any]] = field(default_factory=dict)

    def resolved_algorithms(self) -> list[str]:
        """The algorithm names to run (``all`` expanded to every shipped algorithm)."""
        if self.algorithms == ("all",):
            from hipress.compll import algorithms

            return list(algorithms())
        return list(self.algorithms)

    def cells(self) -> list[tuple[str, str]]:
        """(algorithm or :data:`DDP`, optimizer) pairs, DDP first for each optimizer."""
        names = [DDP, *self.resolved_algorithms()]
        return [(a, o) for o in self.optimizers for a in names]


class MLP(nn.Module):
    """``features`` -> ``hidden`` (ReLU) -> ``classes``; returns logits."""

    def __init__(self, features: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def _mlp_data(opts: RobustnessOptions, rank: int, world: int) -> dict[str, torch.Tensor]:
    """This rank's training samples for every step and the shared eval set: Gaussian inputs,
    labels drawn from a softmax over a fixed random linear map (some label noise, so the best
    loss is above zero)."""
    teacher = torch.randn(opts.features, opts.classes, generator=torch.Generator().manual_seed(0))
    teacher *= 8.0 / math.sqrt(opts.features)

    def draw(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(count, opts.features, generator=gen)
        y = torch.multinomial(torch.softmax(x @ teacher, 1), 1, generator=gen).squeeze(1)
        return x, y

    x, y = draw(opts.steps * opts.batch, 1 + rank)
    ex, ey = draw(opts.eval_size, 1000 + world)
    return {"x": x, "y": y, "eval_x": ex, "eval_y": ey}


def _lm_data(opts: RobustnessOptions, rank: int, world: int) -> dict[str, torch.Tensor]:
    """This rank's windows for every step (rank-strided, in a fixed shuffled order, reused
    when the steps need more than the text has) and the held-out windows."""
    from hipress.bench.workloads import load_corpus

    corpus = load_corpus(opts.vocab, 1 << 20)

    def windows(ids: torch.Tensor) -> torch.Tensor:
        n = (len(ids) - 1) // opts.bptt
        return torch.stack([ids[i * opts.bptt : i * opts.bptt + opts.bptt + 1] for i in range(n)])

    train = windows(corpus.train)
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(0))
    need = opts.steps * opts.batch * world
    idx = order.repeat(need // len(order) + 1)[:need].view(opts.steps, world, opts.batch)
    valid = windows(corpus.valid)[: max(1, opts.eval_size // opts.bptt)]
    return {"windows": train[idx[:, rank]], "eval": valid}


def _model(opts: RobustnessOptions, vocab: int) -> nn.Module:
    torch.manual_seed(0)
    if opts.task == "mlp":
        return MLP(opts.features, opts.hidden, opts.classes)
    from hipress.bench.workloads import LSTMLM

    return LSTMLM(vocab, emb=128, hidden=256, layers=1, cutoffs=(1000, 4000))


def _loss(opts: RobustnessOptions, model: nn.Module, data: dict[str, torch.Tensor],
          step: int | None) -> torch.Tensor:  # fmt: skip
    """The training loss of ``step``'s batch, or the eval loss (``step`` None)."""
    if opts.task == "mlp":
        if step is None:
            x, y = data["eval_x"], data["eval_y"]
        else:
            sl = slice(step * opts.batch, (step + 1) * opts.batch)
            x, y = data["x"][sl], data["y"][sl]
        return nn.functional.cross_entropy(model(x), y)
    w = data["eval"] if step is None else data["windows"][step]
    return model(w[:, :-1], w[:, 1:])


def _optimizer(name: str, params: Any, opts: RobustnessOptions) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=opts.sgd_lr, momentum=opts.momentum)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=opts.adamw_lr)
    raise ValueError(f"unknown optimizer {name!r}: use one of {', '.join(OPTIMIZERS)}")


def _cell(rank: int, world: int, algorithm: str, optimizer: str, opts: RobustnessOptions,
          data: dict[str, torch.Tensor], vocab: int) -> dict[str, Any]:  # fmt: skip
    """Train one cell as a user would: DDP, the optimizer made first, then CaSync registered
    with the algorithm's defaults and the default plan (the optimizer passed along, so CaSync
    may refuse a combination that cannot train). Returns the eval loss (rank 0) or the
    refusal."""
    from torch.nn.parallel import DistributedDataParallel

    import hipress.casync

    model = _model(opts, vocab)
    ddp = DistributedDataParallel(model)
    opt = _optimizer(optimizer, ddp.parameters(), opts)
    state = None
    t0 = time.perf_counter()
    try:
        if algorithm != DDP:
            state = hipress.casync.register(
                ddp, algorithm, params=opts.params.get(algorithm), optimizer=opt,
                backend=opts.backend, log_every=0,
            )  # fmt: skip
        for step in range(opts.steps):
            opt.zero_grad(set_to_none=False)
            _loss(opts, ddp, data, step).backward()
            opt.step()
    except hipress.casync.CaSyncError as exc:  # the same on every rank: nothing is in flight
        dist.barrier()
        return {"refused": str(exc)}
    finally:
        if state is not None:
            state.close()
    seconds = time.perf_counter() - t0
    # the strategies the plan chose for the compressed tensors
    plan = sorted({e.strategy.value for e in state.plan.entries if e.compress}) if state else []
    dist.barrier()
    with torch.no_grad():
        model.eval()
        loss = float(_loss(opts, model, data, None))
    return {
        "loss": loss if math.isfinite(loss) else float("inf"),
        "seconds": seconds,
        "strategies": plan,
    }


def run_cells(rank: int, world: int, cells: list[tuple[str, str]],
              opts: RobustnessOptions) -> list[dict[str, Any]]:  # fmt: skip
    """A worker's body: every cell in turn, in one process group. Returns one row per cell."""
    vocab = 0
    if opts.task == "mlp":
        data = _mlp_data(opts, rank, world)
    elif opts.task == "lm":
        data = _lm_data(opts, rank, world)
        from hipress.bench.workloads import load_corpus

        vocab = load_corpus(opts.vocab, 1 << 20).vocab_size
    else:
        raise ValueError(f"unknown task {opts.task!r}: use mlp or lm")
    rows = []
    for algorithm, optimizer in cells:
        row = {"algorithm": algorithm, "optimizer": optimizer}
        row.update(_cell(rank, world, algorithm, optimizer, opts, data, vocab))
        rows.append(row)
    return rows


def verdict(row: dict[str, Any], ddp_loss: float, tolerance: float) -> str:
    """The verdict on a row: "refused", "ok" (eval loss within ``tolerance`` of DDP's, or
    below it) or "FAIL"."""
    if "refused" in row:
        return "refused"
    return "ok" if row["loss"] <= ddp_loss * (1.0 + tolerance) else "FAIL"


def run_robustness(opts: RobustnessOptions, progress: Any = None) -> dict[str, Any]:
    """Run every cell of ``opts`` (one launch of the workers); returns ``{"meta", "rows"}`` where
    each row has ``algorithm``, ``optimizer`` and either ``loss`` (rank 0's eval loss),
    ``ratio`` (against DDP's with the same optimizer) and ``seconds``, or ``refused`` (CaSync's
    message); ``verdict`` is :func:`verdict`'s."""
    from hipress.bench.netsim import LoopbackNetwork, run_in_network

    cells = opts.cells()
    if progress is not None:
        progress(f"robustness | {opts.task}: {len(cells)} cells of {opts.steps} steps")
    net = LoopbackNetwork(opts.workers, "robustness does not depend on the network")
    rows = run_in_network(net, run_cells, cells, opts, timeout=opts.timeout,
                          threads=opts.threads)[0]  # fmt: skip
    base = {r["optimizer"]: r["loss"] for r in rows if r["algorithm"] == DDP}
    for r in rows:
        if "loss" in r:
            r["ratio"] = r["loss"] / base[r["optimizer"]]
        r["verdict"] = verdict(r, base[r["optimizer"]], opts.tolerance)
    meta = {
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        **{k: v for k, v in vars(opts).items() if k != "algorithms"},
    }
    return {"meta": meta, "rows": rows}


def robustness_markdown(results: dict[str, Any]) -> str:
    """A markdown page of :func:`run_robustness`'s results: the table of
    :func:`~hipress.bench.tables.robustness_table` (one row per algorithm, one column per
    optimizer) under a title, the date and the command."""
    from hipress.bench.tables import robustness_table

    m = results["meta"]
    out = ["# Robustness to the user's optimizer", "",
           f"{m['date']}. Command: `{m.get('command', '?')}`", "", *robustness_table(results)]  # fmt: skip
    return "\n".join(out) + "\n"
