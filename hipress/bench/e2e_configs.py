"""The configurations of ``hipress bench e2e`` (:mod:`hipress.bench.e2e`): each way to train
(:class:`Config`: compute only, DDP with one of PyTorch's hooks, hipress with an algorithm),
the baselines, and what a run covers (:class:`E2EOptions`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hipress.bench import fsdp as fsdp_bench
from hipress.bench.fsdp_rows import e2e_configs
from hipress.bench.workloads import WORKLOADS

__all__ = [
    "BASELINES",
    "COMPUTE",
    "NOCOMM",
    "SYNC",
    "Config",
    "E2EOptions",
    "cap_name",
    "configs_for",
    "fsdp_configs_for",
]

# powerSGD_hook needs a single DDP bucket on gloo (docs/reference/benchmarks.md)
_ONE_BUCKET_MB = 4096


@dataclass(frozen=True)
class Config:
    """One way to train. ``kind``: "compute" (no gradient exchange), "ddp" (``hook`` is
    "allreduce", "fp16" or "powersgd"), "hipress" (``algorithm`` under ``plan``) or "rounds"
    (a multi-round ``algorithm``, e.g. powersgd at ``powersgd_rank``, through
    ``hipress.casync.register`` with DDP's default buckets: embeddings as exact rows where
    sparse)."""

    name: str
    kind: str
    hook: str = "allreduce"
    algorithm: str | None = None
    plan: str | None = "auto"
    bucket_cap_mb: float | str | None = None  # "auto": SeCoPa's, resolved per cell (e2e_caps)
    powersgd_rank: int = 4
    rows: bool = False  # (hipress) the default rule's plan, row-sparse where a probe says
    include: tuple[str, ...] = ()  # (hipress) register(include=...): compressed, embeddings too
    cap_advice: dict[str, Any] | None = field(default=None, compare=False)  # why that cap

    def describe(self) -> str:
        """One line for tables."""
        if self.kind == "compute":
            return "compute only (no gradient exchange)"
        if self.kind == "ddp" and self.hook == "noop":
            return "DDP, no gradient exchange (DDP's own cost)"
        if self.kind == "ddp" and self.hook == "sync":
            return "DDP, one 4-byte all-reduce per bucket (the cost of synchronising each step)"
        if self.kind == "ddp":
            extra = f", rank {self.powersgd_rank}, one bucket" if self.hook == "powersgd" else ""
            return f"DDP {self.hook}{extra}"
        if self.kind == "rounds":
            return (f"hipress {self.algorithm}, rank {self.powersgd_rank}, default buckets, "
                    "embeddings as rows where sparse")  # fmt: skip
        if self.rows:
            what = f"hipress {self.algorithm}, default rule, row-sparse where sparse (exact)"
        else:
            what = f"hipress {self.algorithm}, plan {self.plan or 'default rule'}"
        if self.include:
            what += f", include={list(self.include)}"
        return what + self._buckets()

    def _buckets(self) -> str:
        """A hipress row's DDP buckets, as run."""
        auto = " (SeCoPa's recommendation)" if self.cap_advice is not None else ""
        cap = self.bucket_cap_mb
        if cap is None:
            return f", DDP's default buckets{auto}"
        return f", bucket_cap_mb {cap if isinstance(cap, str) else f'{cap:g}'}{auto}"


BASELINES = (
    Config("ddp-fp32", "ddp", "allreduce"),
    Config("ddp-fp16", "ddp", "fp16"),
    Config("ddp-powersgd", "ddp", "powersgd", bucket_cap_mb=_ONE_BUCKET_MB),
)
COMPUTE = Config("compute-only", "compute")
# DDP with a hook that exchanges nothing: DDP's own cost (bucketing, autograd hooks), the
# ceiling of any DDP communication hook
NOCOMM = Config("ddp-nocomm", "ddp", "noop")
# DDP with a hook that all-reduces 4 bytes per bucket and keeps the local gradient: what
# synchronising every step costs with no bytes to move (the link's latency, and waiting for the
# slowest worker, which grows when workers share cores), the ceiling of any per-step scheme
SYNC = Config("ddp-sync", "ddp", "sync")


@dataclass(frozen=True)
class E2EOptions:
    """What :func:`run_matrix` runs: ``models`` x ``rates_mbit`` (None: unshaped veth) x
    (compute-only, the baselines, hipress with each of ``algorithms``). With ``fsdp``, also the
    FSDP2 rows (:func:`fsdp_configs_for`) for each ``fsdp_reshard`` setting of
    ``reshard_after_forward``; ``fsdp_bf16_params`` adds the bfloat16-parameter policy.
    ``local_steps``: local-step rows by name (:mod:`~hipress.bench.e2e_local`)."""

    workers: int = 4
    rates_mbit: tuple[float | None, ...] = (1000.0, 10000.0)
    models: tuple[str, ...] = ("lstm-lm", "resnet")
    algorithms: tuple[str, ...] = ("onebit", "tbq", "terngrad", "dgc", "graddrop")
    # parameter names or patterns (register(include=...)): each hipress row gets a twin,
    # hipress-ALGORITHM-include, that may compress them too (embeddings included)
    include: tuple[str, ...] = ()
    # the plans of the hipress rows: the first names hipress-ALGORITHM, each further one a row
    # of its own, hipress-ALGORITHM-PLAN (plan_name): "auto" (SeCoPa), None (CaSync's default
    # rule) or a plan file
    plans: tuple[str | None, ...] = ("auto",)
    steps: int = 10
    warmup: int = 6  # (CaSync counts embedding rows at step 1 and checks its plan at step 5)
    repeats: int = 2
    threads: int = 1
    powersgd_rank: int = 4
    shaped: bool = True
    lr: float = 0.05
    timeout: float = 900.0
    trace_dir: str | None = None
    bucket_view: bool = True
    fsdp: bool = False
    fsdp_reshard: tuple[bool, ...] = (True,)
    fsdp_bf16_params: bool = False
    local_steps: tuple[str, ...] = ()
    row_sparse: tuple[str, ...] = ()  # algorithms ("none": lossless) with row-sparse embeddings
    # DDP bucket caps of the hipress rows, each a row of its own: None (DDP's default), MB or
    # "auto" (SeCoPa's recommendation, hipress.bench.e2e_caps); DDP's rows keep their own
    bucket_caps: tuple[float | str | None, ...] = (None,)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = [m for m in self.models if m not in WORKLOADS]
        if unknown:
            raise ValueError(f"unknown model(s) {unknown}; choose from {sorted(WORKLOADS)}")
        if self.workers < 2:
            raise ValueError(f"workers must be >= 2, got {self.workers}")
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")
        if self.steps < 1 or self.warmup < 3:
            raise ValueError("steps must be >= 1 and warmup >= 3 (PowerSGD starts at step 2)")
        if not self.plans or len(set(map(plan_name, self.plans))) < len(self.plans):
            raise ValueError(f"plans: at least one, no two of the same name, got {self.plans}")
        if not self.bucket_caps or any(c not in (None, "auto") and not (
                isinstance(c, float | int) and c > 0) for c in self.bucket_caps):  # fmt: skip
            raise ValueError(f"bucket_caps are None, 'auto' or MB > 0, got {self.bucket_caps}")
        if self.fsdp and not self.fsdp_reshard:
            raise ValueError("fsdp_reshard needs at least one setting (True, False or both)")
        if self.local_steps:  # ValueError naming a variant that is not one
            from hipress.bench.e2e_local import local_rows

            local_rows(self.local_steps, self.algorithms)


def configs_for(opts: E2EOptions) -> list[Config]:
    """The configurations of one (model, network) cell, compute-only first."""
    base = [
        Config(
            c.name, c.kind, c.hook, bucket_cap_mb=c.bucket_cap_mb, powersgd_rank=opts.powersgd_rank
        )
        for c in BASELINES
    ]
    from hipress.compll.rounds import rounds_algorithms

    multi = set(rounds_algorithms())
    ours = [
        Config(f"hipress-{a}", "rounds", algorithm=a, plan=None, powersgd_rank=opts.powersgd_rank)
        if a in multi
        else Config(f"hipress-{a}{'-' + plan_name(p) if k else ''}", "hipress", algorithm=a, plan=p)
        for a in opts.algorithms
        for k, p in enumerate(opts.plans)
        if k == 0 or a not in multi  # (a multi-round algorithm has one plan)
    ]
    if opts.include:  # each hipress row, then its twin that may compress those too
        twin = {c.name: replace(c, name=f"{c.name}-include", include=opts.include) for c in ours}
        ours = [x for c in ours for x in ((c, twin[c.name]) if c.kind == "hipress" else (c,))]
    rows = [Config(f"hipress-{a}-rows", "hipress", algorithm=None if a == "none" else a,
                   plan=None, rows=True) for a in opts.row_sparse]  # fmt: skip
    out = [COMPUTE, NOCOMM, SYNC, *base]
    for c in [*ours, *rows]:
        if c.kind != "hipress":
            out.append(c)
            continue
        out += [replace(c, name=c.name + cap_name(cap), bucket_cap_mb=cap)
                for cap in opts.bucket_caps]  # fmt: skip
    return out


def plan_name(plan: str | None) -> str:
    """A plan as a row's name ends: auto, default (CaSync's rule) or the plan file's stem."""
    return "default" if plan is None else "auto" if plan == "auto" else Path(plan).stem


def cap_name(cap: float | str | None) -> str:
    """The suffix of a hipress row run at ``cap`` (DDP's default: none)."""
    if cap is None:
        return ""
    return "-cap-auto" if cap == "auto" else f"-cap{float(cap):g}"


def fsdp_configs_for(opts: E2EOptions) -> list[fsdp_bench.FsdpConfig]:
    """The FSDP2 configurations of one cell (none without ``opts.fsdp``): see
    :func:`hipress.bench.fsdp_rows.e2e_configs`."""
    return e2e_configs(opts.algorithms, opts.fsdp_bf16_params) if opts.fsdp else []
