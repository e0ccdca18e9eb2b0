"""End-to-end training throughput on a simulated cluster: every worker in its own network
namespace with a rate-shaped NIC (:mod:`hipress.bench.netsim`), the same model trained by DDP with
PyTorch's own hooks (fp32 allreduce, ``fp16_compress_hook``, ``powerSGD_hook``) and by hipress
(CaSync with each algorithm under its SeCoPa plan), against the model's compute-only rate.

    results = run_matrix(E2EOptions(workers=4, rates_mbit=(1000.0,), models=("lstm-lm",)))

Each configuration runs in fresh worker processes: build the model, wrap it, warm up, then time
``steps`` steps. Figures per configuration: samples/s (all workers), step time (the best of ``repeats`` rounds), bytes each worker
put on its wire per step (its NIC's transmit counter, so TCP/IP headers and every collective are
included), the speedup over each baseline, and the scaling efficiency against the compute-only
rate (the same N processes training with no gradient exchange at all, i.e. an infinitely fast
network on the same CPUs; on a 2-core machine N processes share the cores, so comparing with N x
a lone process would charge CPU sharing to the network). ``ddp-nocomm`` (DDP with a hook that
exchanges nothing) measures DDP's own cost, the ceiling of every DDP hook; ``of_ddp_ceiling`` is
each row's rate against it. Every DDP model is built with ``gradient_as_bucket_view=True`` (one
copy of the gradients fewer per step, for every configuration alike) unless
``E2EOptions.bucket_view`` is False. With a trace directory, each configuration keeps the
timeline of its timed steps (:mod:`hipress.casync.trace`) and its per-step ``breakdown``.
The compute-only run also times when each gradient is ready in backward
(``grad_ready_lead_ms``), from which each DDP fp32/fp16 and hipress row gets its network floor
(``network_floor_ms``, ``efficiency_bound``; :mod:`hipress.bench.tail`).

With ``E2EOptions.fsdp``, each cell also holds FSDP2 rows (``cell["fsdp"]``: a block per
``fsdp_reshard`` setting), run in the same rounds and network by :func:`hipress.bench.fsdp.measure`:
plain FSDP2 (fp32 reduce-scatter), FSDP2 with ``MixedPrecisionPolicy(reduce_dtype=bfloat16)``
and hipress's compressed reduce-scatter with each of ``algorithms`` (feedback "auto"), with
``fsdp_bf16_params`` also the users' bfloat16 policy (``param_dtype=reduce_dtype=bfloat16``)
plain and with each algorithm. Each row has the same figures as a DDP row, per-rank memory, the
payload bytes each collective should send (``traffic``) and the speedup over every FSDP2
baseline; each block the traffic bound of compressing the reduce-scatter alone (``bound``) and
the FSDP2 targets (``targets``). Without ``fsdp`` nothing of this appears.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hipress.bench import fsdp as fsdp_bench
from hipress.bench.fsdp_rows import e2e_configs, finish_block
from hipress.bench.netsim import (
    LoopbackNetwork,
    Network,
    open_network,
    run_in_network,
    tx_bytes,
)
from hipress.bench.report import check_fsdp_targets, check_targets
from hipress.bench.tail import ReadyClock, allreduce_bytes, bytes_sent, exposed_floor_ms
from hipress.bench.workloads import WORKLOADS
from hipress.casync.trace import Tracer
from hipress.timeline import breakdown, load_traces

__all__ = [
    "BASELINES",
    "Config",
    "E2EOptions",
    "configs_for",
    "fsdp_configs_for",
    "run_config",
    "run_matrix",
]

logger = logging.getLogger(__name__)

_ONE_BUCKET_MB = 4096  # powerSGD_hook needs a single DDP bucket on gloo (docs/reference/benchmarks.md)


@dataclass(frozen=True)
class Config:
    """One way to train. ``kind``: "compute" (no gradient exchange), "ddp" (``hook`` is
    "allreduce", "fp16" or "powersgd") or "hipress" (``algorithm`` under ``plan``)."""

    name: str
    kind: str
    hook: str = "allreduce"
    algorithm: str | None = None
    plan: str | None = "auto"
    bucket_cap_mb: float | None = None
    powersgd_rank: int = 4

    def describe(self) -> str:
        """One line for tables."""
        if self.kind == "compute":
            return "compute only (no gradient exchange)"
        if self.kind == "ddp" and self.hook == "noop":
            return "DDP, no gradient exchange (DDP's own cost)"
        if self.kind == "ddp":
            extra = f", rank {self.powersgd_rank}, one bucket" if self.hook == "powersgd" else ""
            return f"DDP {self.hook}{extra}"
        return f"hipress {self.algorithm}, plan {self.plan or 'default rule'}"


BASELINES = (
    Config("ddp-fp32", "ddp", "allreduce"),
    Config("ddp-fp16", "ddp", "fp16"),
    Config("ddp-powersgd", "ddp", "powersgd", bucket_cap_mb=_ONE_BUCKET_MB),
)
COMPUTE = Config("compute-only", "compute")
# DDP with a hook that exchanges nothing: DDP's own cost (bucketing, autograd hooks), the
# ceiling of any DDP communication hook
NOCOMM = Config("ddp-nocomm", "ddp", "noop")


@dataclass(frozen=True)
class E2EOptions:
    """What :func:`run_matrix` runs: ``models`` x ``rates_mbit`` (None: unshaped veth) x
    (compute-only, the baselines, hipress with each of ``algorithms``). With ``fsdp``, also the
    FSDP2 rows (:func:`fsdp_configs_for`) for each ``fsdp_reshard`` setting of
    ``reshard_after_forward``; ``fsdp_bf16_params`` adds the bfloat16-parameter policy."""

    workers: int = 4
    rates_mbit: tuple[float | None, ...] = (1000.0, 10000.0)
    models: tuple[str, ...] = ("lstm-lm", "resnet")
    algorithms: tuple[str, ...] = ("onebit", "tbq", "terngrad", "dgc", "graddrop")
    plan: str | None = "auto"
    steps: int = 10
    warmup: int = 3
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
        if self.fsdp and not self.fsdp_reshard:
            raise ValueError("fsdp_reshard needs at least one setting (True, False or both)")


def configs_for(opts: E2EOptions) -> list[Config]:
    """The configurations of one (model, network) cell, compute-only first."""
    base = [
        Config(
            c.name, c.kind, c.hook, bucket_cap_mb=c.bucket_cap_mb, powersgd_rank=opts.powersgd_rank
        )
        for c in BASELINES
    ]
    ours = [Config(f"hipress-{a}", "hipress", algorithm=a, plan=opts.plan) for a in opts.algorithms]
    return [COMPUTE, NOCOMM, *base, *ours]


def fsdp_configs_for(opts: E2EOptions) -> list[fsdp_bench.FsdpConfig]:
    """The FSDP2 configurations of one cell (none without ``opts.fsdp``): see
    :func:`hipress.bench.fsdp_rows.e2e_configs`."""
    return e2e_configs(opts.algorithms, opts.fsdp_bf16_params) if opts.fsdp else []


# ---- the worker ---------------------------------------------------------------------------------


def _wrap(
    model: torch.nn.Module, cfg: Config, bucket_view: bool = True
) -> tuple[torch.nn.Module, Any]:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    from torch.nn.parallel import DistributedDataParallel as DDP

    if cfg.kind == "compute":
        return model, None
    kw = {} if cfg.bucket_cap_mb is None else {"bucket_cap_mb": cfg.bucket_cap_mb}
    ddp = DDP(model, gradient_as_bucket_view=bucket_view, **kw)  # type: ignore[arg-type]
    if cfg.kind == "hipress":
        import hipress.casync

        state = hipress.casync.register(ddp, algorithm=cfg.algorithm, plan=cfg.plan)
        _ = state.plan  # plan="auto" plans here, in the set-up, rather than in the first step
        return ddp, state
    if cfg.hook == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif cfg.hook == "powersgd":
        state = psgd.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=cfg.powersgd_rank,
            start_powerSGD_iter=2,
            use_error_feedback=True,
            warm_start=True,
        )
        ddp.register_comm_hook(state, psgd.powerSGD_hook)
    elif cfg.hook == "noop":  # DDP's own cost: buckets and hooks, no gradient exchange
        ddp.register_comm_hook(None, _noop_hook)
    elif cfg.hook != "allreduce":
        raise ValueError(f"unknown DDP hook {cfg.hook!r}")
    return ddp, None


def _noop_hook(_: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


# DDP checks the hook's annotations against the real types (postponed evaluation leaves strings)
_noop_hook.__annotations__ = {
    "_": Any, "bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor],
}  # fmt: skip


def _train(
    rank: int,
    world_size: int,
    model_name: str,
    data: Any,
    cfg: Config,
    warmup: int,
    steps: int,
    lr: float,
    iface: str,
    trace: str | None = None,
    bucket_view: bool = True,
) -> dict[str, Any]:
    w = WORKLOADS[model_name]
    t_setup = time.perf_counter()
    model, state = _wrap(w.build(data), cfg, bucket_view)
    setup_s = time.perf_counter() - t_setup
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    batches = [w.batch(data, rank, s) for s in range(warmup + steps)]
    losses: list[float] = []
    tracer = state.tracer if state is not None else Tracer(rank)
    # compute only (nothing delays backward): when each gradient is ready (hipress.bench.tail)
    clock = ReadyClock(model) if cfg.kind == "compute" else None

    def step(i: int) -> None:
        x, y = batches[i]
        with tracer.span("step", "step"):
            opt.zero_grad(set_to_none=False)
            with tracer.span("forward", "compute"):
                loss = w.loss(model, x, y)
            with tracer.span("backward", "compute"):
                loss.backward()
            if clock is not None:
                clock.step_done()
            with tracer.span("optimizer", "compute"):
                opt.step()
            losses.append(float(loss.detach()))

    for i in range(warmup):
        step(i)
    dist.barrier()
    if trace is not None:  # the timed steps' timeline
        tracer.record(trace, steps=None, config=cfg.name, model=model_name)
    tx0 = tx_bytes(iface)
    if clock is not None:
        clock.on = True
    t0 = time.perf_counter()
    for i in range(warmup, warmup + steps):
        step(i)
    seconds = time.perf_counter() - t0
    tx1 = tx_bytes(iface)
    written = tracer.stop()
    dist.barrier()
    out: dict[str, Any] = {
        "seconds": seconds,
        "setup_s": setup_s,
        "tx_bytes": None if tx0 is None or tx1 is None else tx1 - tx0,
        "losses": losses,
        "trace": None if written is None else str(written),
    }
    if clock is not None:
        out["grad_ready_lead_ms"] = clock.leads()
    if state is not None:
        out["casync"] = state.stats.mean()
        out["compressed_tensors"] = sum(e.compress for e in state.plan.entries)
        out["tensors"] = len(state.plan.entries)
        out["plan"] = {
            "entries": [
                [e.name, e.numel, e.compress, e.strategy.value, e.partitions]
                for e in state.plan.entries
            ],
            "totals": dict(state.plan.totals),
            "selection": state.plan.meta.get("selection"),
        }
    return out


# ---- the driver ---------------------------------------------------------------------------------


def run_config(
    net: Network, model_name: str, data: Any, cfg: Config, opts: E2EOptions
) -> dict[str, Any]:
    """Run one configuration on an entered network; returns its figures (see module doc).
    A configuration that fails returns ``{"error": message}`` instead of raising, so one
    broken configuration does not lose the others."""
    w = WORKLOADS[model_name]
    t = time.perf_counter()
    trace = None
    if opts.trace_dir is not None:
        trace = str(Path(opts.trace_dir) / f"{model_name}-{net.world_size}x-{_rate(net)}"
                    / f"{cfg.name}-rank{{rank}}.json")  # fmt: skip
    try:
        per_rank = run_in_network(
            net, _train, model_name, data, cfg, opts.warmup, opts.steps, opts.lr, net.iface,
            trace, opts.bucket_view, timeout=opts.timeout, threads=opts.threads,
        )  # fmt: skip
    except Exception as exc:  # a worker's failure is a result to report, not a crash
        logger.error("e2e: %s on %s failed: %s", cfg.name, model_name, exc)
        return {"config": cfg.name, "error": str(exc)[-2000:]}
    seconds = max(r["seconds"] for r in per_rank)
    samples = w.batch_size * opts.steps * net.world_size
    tx = [r["tx_bytes"] for r in per_rank]
    # loopback's counter is shared with every other process on the machine: not this run's
    wire = None if isinstance(net, LoopbackNetwork) or None in tx else tx
    res: dict[str, Any] = {
        "config": cfg.name,
        "describe": cfg.describe(),
        "samples_per_s": samples / seconds,
        "step_ms": 1000 * seconds / opts.steps,
        "wire_bytes_per_step": None if wire is None else sum(wire) / len(wire) / opts.steps,
        "final_loss": sum(r["losses"][-1] for r in per_rank) / len(per_rank),
        "setup_s": max(r["setup_s"] for r in per_rank),
        "wall_s": time.perf_counter() - t,
    }
    if cfg.algorithm is not None:
        res["algorithm"] = cfg.algorithm
    if "grad_ready_lead_ms" in per_rank[0]:
        leads = [r["grad_ready_lead_ms"] for r in per_rank]
        res["grad_ready_lead_ms"] = {n: sum(x[n] for x in leads) / len(leads) for n in leads[0]}
    traces = [r["trace"] for r in per_rank if r.get("trace")]
    if traces:
        res["traces"] = traces
        res["breakdown"] = breakdown(load_traces(traces))["mean"]
    if "casync" in per_rank[0]:
        res["casync"] = per_rank[0]["casync"]
        res["compressed_tensors"] = per_rank[0]["compressed_tensors"]
        res["plan"] = per_rank[0]["plan"]
        res["tensors"] = per_rank[0]["tensors"]
    logger.info("e2e: %s %s: %.1f samples/s", model_name, cfg.name, res["samples_per_s"])
    return res


def _rate(net: Network) -> str:
    rate = getattr(net, "rate_mbit", None)
    return "loopback" if rate is None else f"{rate:g}mbit"


def _best(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rounds if "samples_per_s" in r]
    if not ok:
        return rounds[-1]
    best = dict(max(ok, key=lambda r: r["samples_per_s"]))
    best["rounds_samples_per_s"] = [r.get("samples_per_s") for r in rounds]
    return best


def _derive(rows: list[dict[str, Any]]) -> None:
    by = {r["config"]: r for r in rows if "samples_per_s" in r}
    compute = by.get(COMPUTE.name)
    for r in rows:
        if "samples_per_s" not in r:
            continue
        r["speedup"] = {
            b.name: r["samples_per_s"] / by[b.name]["samples_per_s"]
            for b in BASELINES
            if b.name in by
        }
        if compute is not None:
            r["scaling_efficiency"] = r["samples_per_s"] / compute["samples_per_s"]
        if NOCOMM.name in by:  # against DDP's own ceiling
            r["of_ddp_ceiling"] = r["samples_per_s"] / by[NOCOMM.name]["samples_per_s"]


def _floors(
    rows: list[dict[str, Any]], numels: dict[str, int], world_size: int, rate_mbit: float | None
) -> None:
    """Each DDP fp32/fp16 and hipress row's network floor (:mod:`hipress.bench.tail`): the
    least communication any schedule of its bytes leaves exposed after backward on this link
    (``network_floor_ms``), and the scaling efficiency that allows (``efficiency_bound``)."""
    from hipress.compll import load

    by = {r["config"]: r for r in rows if "samples_per_s" in r}
    compute = by.get(COMPUTE.name)
    if compute is None or rate_mbit is None or "grad_ready_lead_ms" not in compute:
        return
    leads = compute["grad_ready_lead_ms"]
    for r in by.values():
        if r["config"] in ("ddp-fp32", "ddp-fp16"):
            width = 4.0 if r["config"] == "ddp-fp32" else 2.0
            sent = {n: allreduce_bytes(width * k, world_size) for n, k in numels.items()}
        elif "plan" in r and "algorithm" in r:
            codec = load(r["algorithm"], backend="reference")
            sent = bytes_sent(r["plan"]["entries"], codec.payload_nbytes, world_size)
        else:
            continue
        floor = exposed_floor_ms(leads, sent, rate_mbit)
        r["network_floor_ms"] = floor
        r["efficiency_bound"] = compute["step_ms"] / (compute["step_ms"] + floor)


def _fsdp_blocks(
    opts: E2EOptions, runs: dict[tuple[bool, str], list[dict[str, Any]]], cell: dict[str, Any]
) -> list[dict[str, Any]]:
    """The cell's FSDP2 rows (each configuration's best round), a block per reshard setting,
    with what :func:`hipress.bench.fsdp_rows.finish_block` derives and the targets."""
    compute = next((r for r in cell["rows"] if r["config"] == COMPUTE.name), {})
    blocks = []
    for reshard in opts.fsdp_reshard:
        rows = [_best(v) for (rs, _), v in runs.items() if rs == reshard]
        block = finish_block(rows, reshard, compute.get("samples_per_s"))
        block["targets"] = check_fsdp_targets(cell, block)
        blocks.append(block)
    return blocks


def run_matrix(opts: E2EOptions, progress: Any = None) -> dict[str, Any]:
    """Run every (model, rate) cell; returns ``{"meta": ..., "cells": [...]}`` where each cell
    has ``model``, ``network`` and ``rows`` (one per configuration, with ``speedup`` over each
    baseline and ``scaling_efficiency``). ``progress(text)`` is called before each run. Networks
    are always torn down, also when a run fails or is interrupted."""
    cells = []
    for model_name in opts.models:
        w = WORKLOADS[model_name]
        data = w.prepare()
        numels = {n: p.numel() for n, p in w.build(data).named_parameters() if p.requires_grad}
        n_params = sum(numels.values())
        if progress is not None:
            progress(f"{model_name} | one process alone | compute-only")
        with LoopbackNetwork(1, "one process alone") as solo:
            alone = run_config(solo, model_name, data, COMPUTE, opts)
        for rate in opts.rates_mbit:
            with open_network(opts.workers, rate, shaped=opts.shaped) as net:
                runs: dict[str, list[dict[str, Any]]] = {}
                fsdp_runs: dict[tuple[bool, str], list[dict[str, Any]]] = {}
                # rounds go over every configuration in turn, so a change in the machine's load
                # hits all of them alike; each keeps its best round
                for rnd in range(opts.repeats):
                    for cfg in configs_for(opts):
                        if progress is not None:
                            progress(f"{model_name} | {net.label} | {cfg.name} | round {rnd + 1}")
                        res = run_config(net, model_name, data, cfg, opts)
                        runs.setdefault(cfg.name, []).append(res)
                        if progress is not None and "samples_per_s" in res:
                            progress(f"    {res['samples_per_s']:.1f} samples/s")
                    for reshard in opts.fsdp_reshard if opts.fsdp else ():
                        for fc in fsdp_configs_for(opts):
                            if progress is not None:
                                how = "" if reshard else ", no reshard"
                                progress(f"{model_name} | {net.label} | {fc.name}{how} | "
                                         f"round {rnd + 1}")  # fmt: skip
                            res = fsdp_bench.measure(
                                net, model_name, data, fc, warmup=opts.warmup, steps=opts.steps,
                                lr=opts.lr, reshard=reshard, timeout=opts.timeout,
                                threads=opts.threads,
                            )  # fmt: skip
                            fsdp_runs.setdefault((reshard, fc.name), []).append(res)
                            if progress is not None and "samples_per_s" in res:
                                progress(f"    {res['samples_per_s']:.1f} samples/s")
                rows = [_best(v) for v in runs.values()]
                _derive(rows)
                _floors(rows, numels, net.world_size, getattr(net, "rate_mbit", None))
                cell = {
                    "model": model_name,
                    "kind": w.kind,
                    "parameters": n_params,
                    "gradient_bytes": 4 * n_params,
                    "batch_per_worker": w.batch_size,
                    "unit": w.unit,
                    "data": w.data,
                    "network": net.as_dict(),
                    "compute_alone_samples_per_s": alone.get("samples_per_s"),
                    "rows": rows,
                    "loadavg": os.getloadavg()[0],
                }
                cell["targets"] = check_targets(cell)
                if opts.fsdp:
                    cell["fsdp"] = _fsdp_blocks(opts, fsdp_runs, cell)
                cells.append(cell)
            if isinstance(net, LoopbackNetwork):
                break  # every rate is the same unshaped loopback
    meta = {
        "torch": torch.__version__,
        "workers": opts.workers,
        "steps": opts.steps,
        "warmup": opts.warmup,
        "repeats": opts.repeats,
        "threads_per_worker": opts.threads,
        "lr": opts.lr,
        "plan": opts.plan,
        "powersgd_rank": opts.powersgd_rank,
        "gradient_as_bucket_view": opts.bucket_view,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        **opts.extra,
    }
    if opts.fsdp:
        meta["fsdp"] = {"reshard_after_forward": list(opts.fsdp_reshard),
                        "bf16_params": opts.fsdp_bf16_params, "feedback": "auto"}  # fmt: skip
    return {"meta": meta, "cells": cells}
