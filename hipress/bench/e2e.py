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
each row's rate against it. ``ddp-sync`` (a hook that all-reduces 4 bytes per bucket and keeps the
local gradient) measures what synchronising every step costs with nothing to move: the link's
latency and the wait for the slowest worker, which grows when workers share cores; no per-step
scheme's efficiency can pass it. Every DDP model is built with ``gradient_as_bucket_view=True`` (one
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

With ``E2EOptions.local_steps``, each cell also holds local-step rows (hipress's DiLoCo per
algorithm and H, uncompressed DiLoCo, post-local SGD, torchft's DiLoCo) in the same rounds
(:mod:`~hipress.bench.e2e_local`), with their ``utilisation``, bytes per step and time per outer
sync.

The configurations are in :mod:`~hipress.bench.e2e_configs`, a worker's run in
:mod:`~hipress.bench.e2e_worker`, and what derives from the rounds in
:mod:`~hipress.bench.e2e_rows`.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import torch

from hipress.bench import fsdp as fsdp_bench
from hipress.bench.e2e_caps import resolve
from hipress.bench.e2e_configs import (
    BASELINES,
    COMPUTE,
    NOCOMM,
    SYNC,
    Config,
    E2EOptions,
    configs_for,
    fsdp_configs_for,
)
from hipress.bench.e2e_local import finish_local, local_rows, run_local
from hipress.bench.e2e_rows import best_round, derive, floors, fsdp_blocks
from hipress.bench.e2e_worker import train
from hipress.bench.netsim import LoopbackNetwork, Network, open_network, run_in_network
from hipress.bench.report import check_targets
from hipress.bench.workloads import WORKLOADS
from hipress.timeline import breakdown, load_traces

__all__ = [
    "BASELINES",
    "COMPUTE",
    "NOCOMM",
    "SYNC",
    "Config",
    "E2EOptions",
    "configs_for",
    "fsdp_configs_for",
    "run_config",
    "run_matrix",
]

logger = logging.getLogger(__name__)

Runs = dict[str, list[dict[str, Any]]]  # configuration -> its rounds
FsdpRuns = dict[tuple[bool, str], list[dict[str, Any]]]  # (reshard, configuration) -> rounds


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
            net, train, model_name, data, cfg, opts.warmup, opts.steps, opts.lr, net.iface,
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
    if cfg.kind in ("ddp", "hipress"):
        res["bucket_cap_mb"] = cfg.bucket_cap_mb  # None: DDP's default
    if cfg.cap_advice is not None:
        res["bucket_cap_advice"] = cfg.cap_advice
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


def _progress_rate(progress: Any, res: dict[str, Any]) -> None:
    if progress is not None and "samples_per_s" in res:
        progress(f"    {res['samples_per_s']:.1f} samples/s")


def _rounds(
    net: Network, model_name: str, data: Any, opts: E2EOptions, progress: Any
) -> tuple[Runs, FsdpRuns]:
    """Every configuration of one cell, ``opts.repeats`` rounds each, on ``net``: the DDP and
    hipress rounds, and the FSDP2 rounds of each reshard setting."""
    runs: Runs = {}
    fsdp_runs: FsdpRuns = {}
    caps: dict[str, Config] = {}  # the hipress rows at bucket_cap_mb "auto", resolved
    # rounds go over every configuration in turn, so a change in the machine's load hits all
    # of them alike; each keeps its best round
    for rnd in range(opts.repeats):
        for cfg in configs_for(opts):
            if cfg.bucket_cap_mb == "auto":
                if cfg.name not in caps and progress is not None:
                    progress(f"{model_name} | {net.label} | {cfg.name} | SeCoPa's bucket cap")
                compute = runs.get(COMPUTE.name, [{}])[0]
                rate = getattr(net, "rate_mbit", None)
                cfg = resolve(cfg, model_name, data, compute, net.world_size, rate, caps)
            if progress is not None:
                progress(f"{model_name} | {net.label} | {cfg.name} | round {rnd + 1}")
            res = run_config(net, model_name, data, cfg, opts)
            runs.setdefault(cfg.name, []).append(res)
            _progress_rate(progress, res)
        for row in local_rows(opts.local_steps, opts.algorithms):
            if progress is not None:
                progress(f"{model_name} | {net.label} | {row.variant} | round {rnd + 1}")
            res = run_local(net, model_name, data, row, opts.steps, opts.lr, opts.timeout,
                            opts.threads)  # fmt: skip
            runs.setdefault(row.variant, []).append(res)
            _progress_rate(progress, res)
        for reshard in opts.fsdp_reshard if opts.fsdp else ():
            for fc in fsdp_configs_for(opts):
                if progress is not None:
                    how = "" if reshard else ", no reshard"
                    progress(f"{model_name} | {net.label} | {fc.name}{how} | round {rnd + 1}")
                res = fsdp_bench.measure(
                    net, model_name, data, fc, warmup=opts.warmup, steps=opts.steps, lr=opts.lr,
                    reshard=reshard, timeout=opts.timeout, threads=opts.threads,
                )  # fmt: skip
                fsdp_runs.setdefault((reshard, fc.name), []).append(res)
                _progress_rate(progress, res)
    return runs, fsdp_runs


def _cell(
    net: Network,
    model_name: str,
    numels: dict[str, int],
    alone: dict[str, Any],
    runs: tuple[Runs, FsdpRuns],
    opts: E2EOptions,
) -> dict[str, Any]:
    """One (model, network) cell from its rounds: each configuration's best round with what
    derives from it, the workload, the network, the targets and the FSDP2 blocks."""
    w = WORKLOADS[model_name]
    n_params = sum(numels.values())
    rows = [best_round(v) for v in runs[0].values()]
    derive(rows)
    finish_local(rows, COMPUTE.name)
    floors(rows, numels, net.world_size, getattr(net, "rate_mbit", None))
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
        cell["fsdp"] = fsdp_blocks(opts, runs[1], cell)
    return cell


def _meta(opts: E2EOptions) -> dict[str, Any]:
    meta = {
        "torch": torch.__version__,
        "workers": opts.workers,
        "steps": opts.steps,
        "warmup": opts.warmup,
        "repeats": opts.repeats,
        "threads_per_worker": opts.threads,
        "lr": opts.lr,
        "plans": ["default" if x is None else x for x in opts.plans],
        "include": list(opts.include),
        "powersgd_rank": opts.powersgd_rank,
        "gradient_as_bucket_view": opts.bucket_view,
        "hipress_bucket_caps": ["default" if c is None else c for c in opts.bucket_caps],
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        **opts.extra,
    }
    if opts.local_steps:
        from hipress.bench.diloco_torchft import version

        meta["local_steps"] = list(opts.local_steps)
        meta["torchft"] = version() or "not installed"
    if opts.fsdp:
        meta["fsdp"] = {"reshard_after_forward": list(opts.fsdp_reshard),
                        "bf16_params": opts.fsdp_bf16_params, "feedback": "auto"}  # fmt: skip
    return meta


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
        if progress is not None:
            progress(f"{model_name} | one process alone | compute-only")
        with LoopbackNetwork(1, "one process alone") as solo:
            alone = run_config(solo, model_name, data, COMPUTE, opts)
        for rate in opts.rates_mbit:
            with open_network(opts.workers, rate, shaped=opts.shaped) as net:
                runs = _rounds(net, model_name, data, opts, progress)
                cells.append(_cell(net, model_name, numels, alone, runs, opts))
            if isinstance(net, LoopbackNetwork):
                break  # every rate is the same unshaped loopback
    return {"meta": _meta(opts), "cells": cells}
