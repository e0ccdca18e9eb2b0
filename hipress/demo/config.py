"""Settings and results of the demo: what to train (:class:`DemoConfig`, :class:`RunSpec`) and
what came out (:class:`RunResult`, :class:`DemoResult`), all plain frozen dataclasses that turn
into JSON with ``as_dict()``.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from hipress.bench.gpt import GPTConfig
from hipress.demo.models import model_name
from hipress.demo.wordlm import ModelConfig

__all__ = [
    "DemoConfig",
    "DemoError",
    "DemoResult",
    "EvalPoint",
    "RunResult",
    "RunSpec",
    "default_runs",
]


class DemoError(RuntimeError):
    """The demo could not run: bad settings, or a worker failed or timed out (the message holds
    the worker's traceback)."""


@dataclass(frozen=True)
class RunSpec:
    """One training run.

    Fields:
        name: label in the table and the chart.
        algorithm: CompLL algorithm name, or None for plain DDP allreduce (no hook).
        params: the algorithm's hyper-parameters.
        plan: CaSync plan: ``"auto"`` (SeCoPa), a plan file path, or None (CaSync's default rule).
        backend: CompLL backend of the algorithm's kernels ("auto", "cpu", "reference").
    """

    name: str
    algorithm: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    plan: str | None = "auto"
    backend: str = "auto"


def default_runs(
    algorithm: str = "topk",
    params: dict[str, Any] | None = None,
    plan: str | None = "auto",
    backend: str = "auto",
) -> tuple[RunSpec, RunSpec]:
    """The demo's two runs: plain DDP, then hipress with ``algorithm``, ``plan``, ``backend``."""
    return (
        RunSpec("uncompressed", None, {}, None),
        RunSpec(f"hipress {algorithm}", algorithm, dict(params or {}), plan, backend),
    )


@dataclass(frozen=True)
class DemoConfig:
    """Settings of one demo job (the same for every run).

    Fields:
        workers: worker processes (one gloo rank each).
        steps: optimizer steps per run.
        batch: sequences per worker per step.
        seq_len: tokens per sequence (truncated BPTT length).
        model: the model's shape: :class:`~hipress.demo.wordlm.ModelConfig` (the LSTM) or
            :class:`~hipress.bench.gpt.GPTConfig` (the GPT, whose ``context`` must hold
            ``seq_len``); its ``vocab_size`` must match the corpus.
        lr: Adam learning rate.
        clip: gradient-norm clipping (0: off), applied to the synchronised gradient.
        eval_points: validations per run, evenly spaced, the last at the final step.
        eval_tokens: validation tokens per evaluation (shared among the workers).
        warmup: first steps left out of the throughput figure (bucket rebuild, first hook call).
        seed: seed of the initial weights and of every worker's batch sampler.
        threads: torch threads per worker (0: CPU count / workers, at least 1).
        timeout: seconds the whole job may take before it is stopped.
        progress: rank 0 draws progress bars on stderr.
        trace_dir: where each run keeps the timeline of ``trace_steps`` timed steps (one
            file per rank, :mod:`hipress.casync.trace`); None: none.
        trace_steps: steps in each run's timeline.
    """

    workers: int = 2
    steps: int = 300
    batch: int = 16
    seq_len: int = 32
    model: ModelConfig | GPTConfig = field(default_factory=ModelConfig)
    lr: float = 2e-3
    clip: float = 1.0
    eval_points: int = 3
    eval_tokens: int = 8192
    warmup: int = 5
    seed: int = 0
    threads: int = 0
    timeout: float = 900.0
    progress: bool = True
    trace_dir: str | None = None
    trace_steps: int = 10

    def __post_init__(self) -> None:
        checks = {
            "workers": self.workers >= 1,
            "steps": self.steps >= 1,
            "batch": self.batch >= 1,
            "seq_len": self.seq_len >= 2,
            "lr": self.lr > 0,
            "clip": self.clip >= 0,
            "eval_points": self.eval_points >= 1,
            "eval_tokens": self.eval_tokens >= self.seq_len,
            "warmup": self.warmup >= 0,
            "threads": self.threads >= 0,
            "timeout": self.timeout > 0,
            "trace_steps": self.trace_steps >= 1,
        }
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            vals = ", ".join(f"{k}={getattr(self, k)!r}" for k in bad)
            raise DemoError(f"invalid demo settings: {vals}")
        if isinstance(self.model, GPTConfig) and self.seq_len > self.model.context:
            raise DemoError(
                f"seq_len {self.seq_len} is longer than the GPT's context ({self.model.context})"
            )

    def worker_threads(self) -> int:
        """Torch threads each worker uses."""
        return self.threads or max(1, (os.cpu_count() or 1) // self.workers)

    def eval_steps(self) -> list[int]:
        """Steps (1-based, after that many updates) at which validation runs."""
        k = min(self.eval_points, self.steps)
        return sorted({math.ceil(self.steps * (i + 1) / k) for i in range(k)})


@dataclass(frozen=True)
class EvalPoint:
    """Validation after ``step`` updates: mean next-token loss, accuracy, perplexity."""

    step: int
    loss: float
    accuracy: float

    @property
    def perplexity(self) -> float:
        return math.exp(min(self.loss, 50.0))


@dataclass(frozen=True)
class RunResult:
    """Figures of one run (the mean over workers where workers differ).

    Fields:
        spec: the run.
        plan: what the hook synchronised: ``"-"`` for plain DDP, else a one-line summary.
        compressed_tensors, tensors: parameters compressed by the plan, and all parameters.
        wall_s: wall time of the run (model set-up, planning, training, validation).
        cpu_s: CPU time of the busiest worker over the run (all its threads).
        train_s: time of the timed training steps (after ``warmup``), slowest worker.
        timed_steps: steps in ``train_s``.
        samples_per_s, tokens_per_s: sequences / tokens per second over all workers.
        bytes_per_step: bytes one worker handed to collectives per step (mean).
        bytes_uncompressed_per_step: the gradient bytes per step (what plain DDP sends).
        bytes_total: bytes all workers sent over the whole run.
        train_loss: per-step training loss, mean over workers.
        evals: validation points.
        sync: the hook's mean per-step figures (encode_ms, decode_ms, comm_ms, ...), or {}.
        traces: the timeline files of the run (one per rank), if kept.
        breakdown: where a traced step's time went, ms per step, mean over the ranks
            (:func:`hipress.timeline.breakdown`), or {}.
        predicted_speedup: the plan's predicted sync time uncompressed over its own (0 where
            the plan has no prediction, e.g. the default rule).
        fell_back: whether CaSync's check found compression losing and ran the plain plan
            (:mod:`hipress.casync.verdict`).
    """

    spec: RunSpec
    plan: str
    compressed_tensors: int
    tensors: int
    wall_s: float
    cpu_s: float
    train_s: float
    timed_steps: int
    samples_per_s: float
    tokens_per_s: float
    bytes_per_step: float
    bytes_uncompressed_per_step: float
    bytes_total: float
    train_loss: list[float]
    evals: list[EvalPoint]
    sync: dict[str, float]
    traces: list[str] = field(default_factory=list)
    breakdown: dict[str, float] = field(default_factory=dict)
    predicted_speedup: float = 0.0
    fell_back: bool = False

    @property
    def final(self) -> EvalPoint:
        return self.evals[-1]

    @property
    def ratio(self) -> float:
        """bytes sent / bytes of plain DDP."""
        return self.bytes_per_step / self.bytes_uncompressed_per_step

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["evals"] = [{**asdict(e), "perplexity": e.perplexity} for e in self.evals]
        d["final"] = d["evals"][-1]
        d["ratio"] = self.ratio
        return d


@dataclass(frozen=True)
class DemoResult:
    """The whole job: settings, corpus, model size, network, and one :class:`RunResult` per
    run."""

    config: DemoConfig
    corpus: str
    corpus_digest: str
    parameters: int
    runs: list[RunResult]
    wall_s: float
    network: str = "loopback (127.0.0.1)"

    def as_dict(self) -> dict[str, Any]:
        return {
            "config": asdict(self.config),
            "model": model_name(self.config.model),
            "corpus": self.corpus,
            "corpus_digest": self.corpus_digest,
            "parameters": self.parameters,
            "wall_s": self.wall_s,
            "network": self.network,
            "torch": torch.__version__,
            "runs": [r.as_dict() for r in self.runs],
        }
