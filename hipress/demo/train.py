"""The demo's training job: N local workers train the demo's model (:mod:`~hipress.demo.models`:
the LSTM or the GPT) on the standard-library corpus, once per
:class:`~hipress.demo.config.RunSpec` (plain DDP, then hipress).

    corpus = load_corpus(config.model.vocab_size)
    result = run_demo(config, default_runs("topk"), corpus)   # DemoResult, JSON-able

The workers are started once (:func:`~hipress.demo.launch.launch`) and train every run in turn,
each from the same initial weights on the same batches. Rank 0 draws one progress bar per run
on stderr when ``config.progress`` is set.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from hipress.casync.trace import Tracer
from hipress.demo.config import DemoConfig, DemoError, DemoResult, EvalPoint, RunResult, RunSpec
from hipress.demo.data import Corpus, eval_windows, sample_batch, shard
from hipress.demo.launch import launch
from hipress.demo.models import build_model
from hipress.demo.wordlm import evaluate
from hipress.timeline import breakdown, load_traces

__all__ = ["run_demo"]


class _Progress:
    """One progress bar on stderr: tqdm if installed, else a line redrawn in place (a TTY) or
    printed every ten seconds (a pipe)."""

    def __init__(self, desc: str, total: int) -> None:
        self.total, self.n, self.desc = total, 0, desc
        self._t0 = self._last = time.perf_counter()
        self._tty = sys.stderr.isatty()
        try:
            from tqdm import tqdm
        except ImportError:
            self._bar: Any = None
        else:
            # a thread lock, not tqdm's default multiprocessing one: this worker ends with
            # os._exit, which would leave that semaphore to the parent's resource tracker
            # ("leaked semaphore objects" at exit)
            tqdm.set_lock(threading.RLock())
            self._bar = tqdm(total=total, desc=desc, unit="step", file=sys.stderr, leave=True)

    def update(self, info: str) -> None:
        self.n += 1
        if self._bar is not None:
            self._bar.set_postfix_str(info, refresh=False)
            self._bar.update(1)
            return
        now = time.perf_counter()
        if self.n < self.total and now - self._last < (0.2 if self._tty else 10.0):
            return
        self._last = now
        rate = self.n / max(now - self._t0, 1e-9)
        line = f"{self.desc}: {self.n}/{self.total} steps, {rate:.2f} step/s, {info}"
        sys.stderr.write(f"\r{line}\x1b[K" if self._tty else line + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self._tty:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _status(enabled: bool, text: str) -> None:
    if enabled:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()


def _adam(params: list[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    try:  # the fused CPU kernel is ~10x faster than the per-tensor loop (torch >= 2.4)
        return torch.optim.Adam(params, lr=lr, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.Adam(params, lr=lr, foreach=True)


def _register_hook(ddp: DistributedDataParallel, spec: RunSpec, seed: int) -> Any:
    from hipress import casync  # deferred: plain DDP runs need no compression machinery

    return casync.register(
        ddp,
        algorithm=spec.algorithm,
        params=spec.params,
        plan=spec.plan,
        seed=seed,
        backend=spec.backend,
        log_every=0,
    )


def _plan_summary(state: Any) -> tuple[str, int]:
    if state is None:
        return "-", 0
    comp = [e for e in state.plan.entries if e.compress]
    kinds = sorted({f"{e.strategy.value} K={e.partitions}" for e in comp})
    text = f"{len(comp)}/{len(state.plan.entries)} tensors compressed"
    return text + (f" ({', '.join(kinds)})" if kinds else ""), len(comp)


@dataclass
class _Tally:
    """What one run records on this rank, step by step: the loss, the bytes sent (CaSync's
    count, else the gradient's size), the evaluations ``(step, loss, accuracy)``, CaSync's
    per-step figures, and the seconds of the timed steps."""

    losses: list[float] = field(default_factory=list)
    sent: list[int] = field(default_factory=list)
    evals: list[tuple[int, float, float]] = field(default_factory=list)
    sync_rows: list[dict[str, float]] = field(default_factory=list)
    train_s: float = 0.0

    def add(self, loss: torch.Tensor, state: Any, grad_bytes: int) -> None:
        self.losses.append(loss.detach().item())
        last = state.stats.last if state is not None else None
        self.sent.append(last.bytes_sent if last is not None else grad_bytes)
        if last is not None:
            self.sync_rows.append(last.as_dict())

    def sync(self) -> dict[str, float]:
        """CaSync's figures, averaged over the steps ({} without CaSync)."""
        keys = ("encode_ms", "decode_ms", "comm_ms", "wait_ms", "sync_ms", "collectives")
        rows = self.sync_rows
        return {k: sum(r[k] for r in rows) / len(rows) for k in keys} if rows else {}

    def info(self) -> str:
        """The progress bar's text after the last step."""
        acc = f", val acc {self.evals[-1][2]:.3f}" if self.evals else ""
        return f"loss {self.losses[-1]:.3f}, {self.sent[-1] / 2**20:.2f} MiB/step{acc}"


def _step(
    ddp: nn.Module, opt: torch.optim.Optimizer, params: list[nn.Parameter], tracer: Tracer,
    data: torch.Tensor, gen: torch.Generator, cfg: DemoConfig,
) -> torch.Tensor:  # fmt: skip
    """One training step on a batch drawn from ``data`` with ``gen``, each phase a span of
    ``tracer``; returns the loss."""
    with tracer.span("step", "step"):
        x, y = sample_batch(data, cfg.batch, cfg.seq_len, gen)
        with tracer.span("forward", "compute"):
            out = ddp(x).reshape(-1, cfg.model.vocab_size)
            loss = nn.functional.cross_entropy(out, y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        with tracer.span("backward", "compute"):
            loss.backward()
        with tracer.span("optimizer", "compute"):
            if cfg.clip:
                nn.utils.clip_grad_norm_(params, cfg.clip)
            opt.step()
    return loss


def _evaluate(model: nn.Module, windows: Any, step: int) -> tuple[int, float, float]:
    """``(step, loss, accuracy)`` on the held-out windows of every rank (collective)."""
    totals = torch.tensor(evaluate(model, windows), dtype=torch.float64)
    dist.all_reduce(totals)
    return step, float(totals[0] / totals[2]), float(totals[1] / totals[2])


def _setup(
    cfg: DemoConfig, spec: RunSpec, show: bool
) -> tuple[nn.Module, DistributedDataParallel, Any]:
    """The model from ``cfg.seed``, wrapped by DDP, with CaSync's hook for ``spec`` (the state,
    or None for plain DDP)."""
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model)
    ddp = DistributedDataParallel(model)
    state = None
    if spec.algorithm is not None:
        _status(show and spec.plan == "auto", f"[{spec.name}] SeCoPa is planning...")
        state = _register_hook(ddp, spec, cfg.seed)
    return model, ddp, state


def _train_run(
    rank: int, world: int, corpus: Corpus, cfg: DemoConfig, spec: RunSpec
) -> dict[str, Any]:
    """Train ``spec`` on this rank (collective: every rank calls it); returns its figures."""
    show = cfg.progress and rank == 0
    t_start, cpu_start = time.perf_counter(), time.process_time()
    model, ddp, state = _setup(cfg, spec, show)
    plan, ncomp = _plan_summary(state)
    totals = dict(state.plan.totals) if state is not None else {}
    _status(show and state is not None, f"[{spec.name}] plan: {plan}")
    params = [p for p in model.parameters() if p.requires_grad]
    grad_bytes = sum(p.numel() * p.element_size() for p in params)
    opt = _adam(params, cfg.lr)
    gen = torch.Generator().manual_seed(cfg.seed * 1000 + rank)
    data = shard(corpus.train, rank, world)
    windows = eval_windows(corpus.valid, cfg.seq_len, cfg.eval_tokens, rank, world)
    evals_at = set(cfg.eval_steps())
    untimed = min(cfg.warmup, cfg.steps - 1)
    tally = _Tally()
    bar = _Progress(spec.name, cfg.steps) if show else None
    tracer = state.tracer if state is not None else Tracer(rank)
    traced = range(untimed + 1, untimed + 1 + cfg.trace_steps) if cfg.trace_dir else range(0)
    try:
        for step in range(1, cfg.steps + 1):
            if traced and step == traced.start:
                name = spec.name.replace(" ", "-")
                tracer.record(f"{cfg.trace_dir}/{name}-rank{{rank}}.json", None, run=spec.name)
            t0 = time.perf_counter()
            loss = _step(ddp, opt, params, tracer, data, gen, cfg)
            if step > untimed:
                tally.train_s += time.perf_counter() - t0
            if (traced and step == traced.stop - 1) or step == cfg.steps:
                tracer.stop()
            tally.add(loss, state, grad_bytes)
            if step in evals_at:
                tally.evals.append(_evaluate(model, windows, step))
            if bar is not None:
                bar.update(tally.info())
    finally:
        if bar is not None:
            bar.close()
    dist.barrier()
    return {
        "trace": None if tracer.written is None else str(tracer.written),
        "plan": plan,
        "compressed": ncomp,
        "tensors": len(params),
        "wall_s": time.perf_counter() - t_start,
        "cpu_s": time.process_time() - cpu_start,
        "train_s": tally.train_s,
        "timed_steps": cfg.steps - untimed,
        "losses": tally.losses,
        "sent": tally.sent,
        "grad_bytes": grad_bytes,
        "evals": tally.evals,
        "sync": tally.sync(),
        "parameters": sum(p.numel() for p in params),
        "predicted": totals.get("all_uncompressed", 0.0) / totals["planned"]
        if totals.get("planned")
        else 0.0,
        "fell_back": state is not None and "fallback" in state.plan.meta,
    }


def _work(
    rank: int, world: int, corpus: Corpus, cfg: DemoConfig, runs: Sequence[RunSpec]
) -> list[dict[str, Any]]:
    return [_train_run(rank, world, corpus, cfg, spec) for spec in runs]


def _merge(spec: RunSpec, rows: Sequence[dict[str, Any]], cfg: DemoConfig) -> RunResult:
    r0, world = rows[0], len(rows)
    steps = len(r0["losses"])
    train_s = max(r["train_s"] for r in rows)
    samples = world * cfg.batch * r0["timed_steps"]
    sent_total = sum(sum(r["sent"]) for r in rows)
    traces = [r["trace"] for r in rows if r.get("trace")]
    return RunResult(
        spec=spec,
        plan=r0["plan"],
        compressed_tensors=r0["compressed"],
        tensors=r0["tensors"],
        wall_s=max(r["wall_s"] for r in rows),
        cpu_s=max(r["cpu_s"] for r in rows),
        train_s=train_s,
        timed_steps=r0["timed_steps"],
        samples_per_s=samples / train_s if train_s > 0 else 0.0,
        tokens_per_s=samples * cfg.seq_len / train_s if train_s > 0 else 0.0,
        bytes_per_step=sent_total / (world * steps),
        bytes_uncompressed_per_step=float(r0["grad_bytes"]),
        bytes_total=float(sent_total),
        train_loss=[sum(r["losses"][i] for r in rows) / world for i in range(steps)],
        evals=[EvalPoint(s, loss, acc) for s, loss, acc in r0["evals"]],
        sync={k: sum(r["sync"][k] for r in rows) / world for k in r0["sync"]},
        traces=traces,
        breakdown=breakdown(load_traces(traces))["mean"] if traces else {},
        predicted_speedup=r0["predicted"],
        fell_back=any(r["fell_back"] for r in rows),
    )


def run_demo(
    config: DemoConfig,
    runs: Sequence[RunSpec],
    corpus: Corpus,
    on_tick: Callable[[], None] | None = None,
    net: Any = None,
) -> DemoResult:
    """Train every run of ``runs`` on ``config.workers`` fresh local worker processes.

    ``corpus`` must have ``config.model.vocab_size`` tokens in its vocabulary. ``on_tick`` is
    called about ten times a second while the workers run; ``net`` is an entered
    :class:`hipress.bench.netsim.Network` to run the workers in (None: loopback). Returns every run's figures. Raises
    :class:`DemoError` if the settings do not fit the corpus, a worker fails (the message holds
    its traceback) or the job exceeds ``config.timeout``.
    """
    if not runs:
        raise DemoError("no runs to train")
    if len(corpus.vocab) != config.model.vocab_size:
        raise DemoError(
            f"the corpus has {len(corpus.vocab)} tokens but the model expects "
            f"{config.model.vocab_size}"
        )
    per_worker = corpus.train.numel() // config.workers
    if per_worker <= config.seq_len + 1:
        raise DemoError(
            f"{config.workers} workers leave {per_worker} training tokens each, too few for "
            f"sequences of {config.seq_len}"
        )
    t0 = time.perf_counter()
    rows = launch(
        _work,
        config.workers,
        (corpus, config, tuple(runs)),
        timeout=config.timeout,
        threads=config.worker_threads(),
        on_tick=on_tick,
        net=net,
    )
    return DemoResult(
        config=config,
        corpus=corpus.describe(),
        corpus_digest=corpus.digest(),
        parameters=rows[0][0]["parameters"],
        runs=[_merge(spec, [r[i] for r in rows], config) for i, spec in enumerate(runs)],
        wall_s=time.perf_counter() - t0,
        network=net.label if net is not None else "loopback (127.0.0.1)",
    )
