"""What ``hipress bench convergence`` runs (:class:`ConvergenceOptions`), its tasks' defaults
(:data:`TASKS`), and what an algorithm needs of the training loop: DGC's density warm-up
(:func:`density_schedule`), a momentum of its own (:func:`own_momentum`), and why FSDP mode
refuses one (:func:`fsdp_refusal`). Shared by the driver (:mod:`~hipress.bench.convergence`)
and each rank's run (:mod:`~hipress.bench.convergence_train`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "TASKS",
    "ConvergenceOptions",
    "TaskSpec",
    "density_schedule",
    "fsdp_refusal",
    "own_momentum",
]


GPT_LR = 0.1


@dataclass(frozen=True)
class TaskSpec:
    """A convergence task's defaults: ``lr``, ``batch`` (samples per rank per step), ``clip``,
    a one-line ``description`` for the results and, for a language model, ``window`` (tokens
    per training window; 0 for other tasks)."""

    lr: float
    batch: int
    clip: float
    description: str
    window: int = 0


TASKS: dict[str, TaskSpec] = {
    "lm": TaskSpec(
        0.5, 8, 1.0, "word-level LSTM LM (adaptive softmax) on Python stdlib sources", 32
    ),
    "gpt": TaskSpec(
        GPT_LR,
        4,
        1.0,
        "GPT-2-style LM (4 x 128 wide, tied embeddings) on Python stdlib sources",
        128,
    ),
    "gpt-untied": TaskSpec(
        GPT_LR,
        4,
        1.0,
        "GPT-2-style LM (4 x 128 wide, untied embeddings) on Python stdlib sources",
        128,
    ),
    "tabular": TaskSpec(
        0.05, 32, 1.0, "MLP classifier (32-2048-256-10) on a synthetic teacher-student task"
    ),
}


@dataclass(frozen=True)
class ConvergenceOptions:
    """The job: ``task`` ("lm", "gpt", "gpt-untied" or "tabular", see :data:`TASKS`)
    on ``workers`` ranks for ``epochs`` epochs, once per seed in ``seeds`` (each seed sets the
    initial weights, the batch order and CaSync's RNG). Language models: passes over
    ``train_tokens`` tokens in windows of ``bptt`` tokens (None: the task's window, see
    :meth:`window`), a ``vocab``-word vocabulary, accuracy on ``eval_tokens`` held-out
    tokens. Tabular: ``train_samples`` and ``eval_samples`` samples. ``batch`` samples (LM:
    windows) per rank per step, SGD (``lr``, ``momentum``, gradient norm clipped to ``clip``
    unless it is 0; ``batch``, ``lr`` and ``clip`` None take the task's defaults) with
    ``lr_schedule`` "constant" or "cosine" (decay to 0 over the run). ``algorithms``: names, or
    ("all",) for every shipped one. ``plan``: CaSync's plan ("auto", a file, or None for its
    default rule); CaSync's uncompressed warm-up lasts ``warmup_steps`` plus ``warmup_epochs``
    epochs; ``density_warmup_epochs``: DGC's warm-up for every sparsifier from the first
    compressed step on, see :func:`density_schedule`. ``momentum_handover``: an algorithm with
    its own momentum (dgc) takes over the optimizer's when compression starts, see
    :mod:`~hipress.bench.convergence_train`; False runs it as before, with no optimizer
    momentum on any parameter from the first step (for comparison). ``fsdp``: shard the model
    with FSDP2 instead of DDP (:mod:`~hipress.bench.convergence_fsdp`): uncompressed is plain
    FSDP2, each algorithm :func:`hipress.fsdp.register` with error feedback ``fsdp_feedback``
    (or the ``"name:feedback"`` of its entry in ``algorithms``); the warm-up runs the same
    way, and algorithms that need CaSync's state (a momentum hand-over, a density warm-up)
    are refused. ``local_steps``: local-step variants trained as rows too
    (:mod:`~hipress.bench.convergence_local`), for ``local_epochs`` epochs if given (>=
    ``epochs``: their loss and accuracy are still taken after ``epochs``, the rest only extends
    their training-loss curve, for the time to DDP's final loss); ``rate_mbit``: run every row
    on a shaped link of that rate (None: loopback), so their training times are the link's.
    ``row_sparse``: algorithms (``"none"``: lossless) also trained as ``ALGORITHM-rows`` rows,
    the embeddings synchronised as their touched rows from the first step, as ``hipress bench
    e2e --rows`` runs them (:mod:`~hipress.bench.convergence_rows`), under DDP only."""

    workers: int = 4
    algorithms: tuple[str, ...] = ("all",)
    epochs: int = 2
    task: str = "lm"
    seeds: tuple[int, ...] = (0,)
    plan: str | None = None
    include: tuple[str, ...] = ()  # CaSync's register(include=...): compressed, embeddings too
    threads: int = 1
    batch: int | None = None
    bptt: int | None = None
    vocab: int = 8192
    train_tokens: int = 160_000
    eval_tokens: int = 16_384
    train_samples: int = 16_384
    eval_samples: int = 4096
    lr: float | None = None
    lr_schedule: str = "constant"
    momentum: float = 0.9
    clip: float | None = None
    warmup_steps: int = 0
    warmup_epochs: float = 0.0
    density_warmup_epochs: int = 0
    momentum_handover: bool = True
    fsdp: bool = False
    fsdp_feedback: str = "auto"
    timeout: float = 3600.0
    local_steps: tuple[str, ...] = ()
    local_epochs: int | None = None
    rate_mbit: float | None = None
    row_sparse: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"unknown task {self.task!r}: choose one of {', '.join(TASKS)}")
        if self.bptt is not None and self.bptt < 1:
            raise ValueError(f"bptt must be >= 1, got {self.bptt}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must be distinct and at least one, got {self.seeds}")
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")
        if self.lr_schedule not in ("constant", "cosine"):
            raise ValueError(f"lr_schedule must be constant or cosine, got {self.lr_schedule!r}")
        if not self.fsdp:
            colon = [a for a in self.algorithms if ":" in a]
            if colon:
                raise ValueError(
                    f"an algorithm:feedback entry ({colon[0]}) needs the FSDP2 mode (--fsdp); "
                    "CaSync runs each algorithm with its own feedback"
                )
        elif self.local_steps:
            raise ValueError("local-step variants train unsharded replicas: leave out --fsdp")
        elif self.row_sparse:
            raise ValueError("row-sparse rows (--rows) are CaSync's, under DDP: leave out --fsdp")
        elif self.plan is not None or self.include:
            raise ValueError(
                "plans and include= are CaSync's; the FSDP2 mode compresses each unit by "
                "hipress.fsdp's size threshold: leave --plan at its default and --include out"
            )

        if self.local_steps:  # ValueError naming a variant that is not one
            from hipress.bench.diloco import parse_variants

            parse_variants(self.local_steps, tuple(a for a in self.algorithms if a != "all"))
        if self.local_epochs is not None:
            if not self.local_steps:
                raise ValueError("local_epochs applies to local-step rows: name them too")
            if self.local_epochs < self.epochs:
                raise ValueError(f"local_epochs ({self.local_epochs}) must be at least epochs "
                                 f"({self.epochs}): rows are compared at equal tokens first")  # fmt: skip
            if self.lr_schedule != "constant":
                raise ValueError("local_epochs needs the constant lr schedule: a cosine decay "
                                 "ends at DDP's last step")  # fmt: skip
        if self.rate_mbit is not None and not self.rate_mbit > 0:
            raise ValueError(f"rate_mbit must be > 0 (None: loopback), got {self.rate_mbit}")

    def window(self) -> int:
        """Tokens per training window of a language-model task: ``bptt``, or the task's."""
        return self.bptt if self.bptt is not None else TASKS[self.task].window

    def resolved_algorithms(self) -> list[str]:
        """The algorithm names to run (``all`` expanded to every shipped algorithm)."""
        if self.algorithms == ("all",):
            from hipress.compll import algorithms

            return list(algorithms())
        return list(self.algorithms)


_DENSITY_PARAMS = {
    "s_percent": lambda d: d,
    "ratio": lambda d: d,
    "drop_ratio": lambda d: 1.0 - d,
}


def density_schedule(
    name: str, epochs: int, steps_per_epoch: int, start: int = 0
) -> list[tuple[int, dict[str, float]]]:
    """DGC's warm-up (Lin et al. 2018) for sparsifier ``name`` as a CaSync ``params_schedule``:
    in epoch e < ``epochs`` of compression (which starts at step ``start``, after CaSync's
    uncompressed warm-up) it sends a fraction ``max(own, 0.25 / 4**e)`` of the elements (75%,
    93.75%, 98.4375%, 99.6% sparsity ...), from epoch ``epochs`` on its own fraction. Empty for
    an algorithm without a fraction parameter (``s_percent``, ``ratio``, ``drop_ratio``) or
    with ``epochs`` 0."""
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
            schedule.append((start + e * steps_per_epoch, {key: value}))
    return schedule


def own_momentum(name: str) -> bool:
    """Whether algorithm ``name`` keeps a momentum of its own (a ``momentum`` parameter > 0)."""
    from hipress.compll import load

    return float(load(name, backend="reference").params.get("momentum", 0.0)) > 0.0


def fsdp_refusal(algorithm: str, opts: ConvergenceOptions) -> str | None:
    """Why ``algorithm`` cannot run in FSDP mode with ``opts`` (None: it can). Refused: an
    algorithm with its own momentum under the momentum hand-over, and a sparsifier under a
    density warm-up; both need CaSync's state, which FSDP mode does not have."""
    if opts.momentum_handover and own_momentum(algorithm):
        return (
            f"{algorithm} keeps its own momentum, which takes over the optimizer's through "
            "CaSync's state when compression starts; FSDP mode has no such hand-over: run "
            f"{algorithm} without --fsdp"
        )
    if density_schedule(algorithm, opts.density_warmup_epochs, 1):
        return (
            f"{algorithm}'s density warm-up (--density-warmup-epochs "
            f"{opts.density_warmup_epochs}) switches its parameters through CaSync's "
            "params_schedule, which FSDP mode does not have: pass --density-warmup-epochs 0 "
            "to run it at its own density from the first compressed step"
        )
    return None
