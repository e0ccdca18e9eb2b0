"""FSDP2 training throughput and per-rank memory on a simulated cluster: plain FSDP2 (float32
reduce-scatter), FSDP2 with ``MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)`` (the obvious
peer) and hipress's compressed reduce-scatter (:mod:`hipress.fsdp`) with each algorithm and
error-feedback option, each worker in its own rate-shaped network namespace
(:mod:`hipress.bench.netsim`), as :mod:`hipress.bench.e2e` runs DDP.

    results = run_fsdp(FsdpOptions(workers=4, rates_mbit=(1000.0,)))

Each configuration runs in fresh worker processes: shard the model (each top-level block a unit,
the root holding the rest), warm up, time ``steps`` steps. Figures per configuration: samples/s,
step time, bytes each worker put on its wire per step, the speedup over both baselines, and per
rank: the parameter shard (plain FSDP2 keeps as much again for the gradient shard), the
compression state (of which error feedback) and the process's peak resident memory.
"""

from __future__ import annotations

import logging
import resource
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hipress.bench.models import WORKLOADS
from hipress.bench.netsim import (
    LoopbackNetwork,
    Network,
    open_network,
    run_in_network,
    tx_bytes,
)

__all__ = ["FsdpConfig", "FsdpOptions", "configs_for", "fsdp_markdown", "run_fsdp"]

logger = logging.getLogger(__name__)

# blocks used outside their own forward (LSTMLM.forward sums out.tail's parameters) stay in the
# root unit: FSDP2 has resharded a block's parameters once its forward returns
_ROOT_HELD = {"lstm-lm": ("out",)}


@dataclass(frozen=True)
class FsdpConfig:
    """One way to reduce gradients: ``kind`` "fsdp" (``reduce`` "fp32" or "bf16") or "hipress"
    (``algorithm`` with ``feedback``)."""

    name: str
    kind: str
    reduce: str = "fp32"
    algorithm: str | None = None
    feedback: str = "auto"

    def describe(self) -> str:
        if self.kind == "fsdp":
            return f"FSDP2, {self.reduce} reduce-scatter"
        return f"hipress {self.algorithm}, feedback {self.feedback}"


BASELINES = (FsdpConfig("fsdp-fp32", "fsdp"), FsdpConfig("fsdp-bf16-reduce", "fsdp", "bf16"))


@dataclass(frozen=True)
class FsdpOptions:
    """What :func:`run_fsdp` runs: ``model`` x ``rates_mbit`` x (the baselines, then hipress
    with each of ``variants``, ``"algorithm:feedback"``)."""

    workers: int = 4
    rates_mbit: tuple[float | None, ...] = (1000.0,)
    model: str = "lstm-lm"
    variants: tuple[str, ...] = ("onebit:fp32", "onebit:bf16", "terngrad:none", "signsgd:int8")
    steps: int = 5
    warmup: int = 2
    repeats: int = 1
    threads: int = 1
    shaped: bool = True
    reshard_after_forward: bool = True
    lr: float = 0.05
    timeout: float = 900.0
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.model not in WORKLOADS:
            raise ValueError(f"unknown model {self.model!r}; choose from {sorted(WORKLOADS)}")
        if self.workers < 2 or self.steps < 1 or self.warmup < 1 or self.repeats < 1:
            raise ValueError("workers must be >= 2, steps, warmup and repeats >= 1")
        for v in self.variants:
            if not v.partition(":")[0]:
                raise ValueError(f"a variant is ALGORITHM[:FEEDBACK], got {v!r}")


def configs_for(opts: FsdpOptions) -> list[FsdpConfig]:
    """The baselines, then one hipress configuration per variant."""
    ours = []
    for v in opts.variants:
        alg, _, fb = v.partition(":")
        ours.append(FsdpConfig(f"hipress-{alg}-{fb or 'auto'}", "hipress", algorithm=alg,
                               feedback=fb or "auto"))  # fmt: skip
    return [*BASELINES, *ours]


def _shard(model: nn.Module, model_name: str, cfg: FsdpConfig, reshard: bool) -> Any:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(reduce_dtype=torch.bfloat16 if cfg.reduce == "bf16" else None)
    for name, child in model.named_children():
        if name not in _ROOT_HELD.get(model_name, ()) and any(True for _ in child.parameters()):
            fully_shard(child, mp_policy=mp, reshard_after_forward=reshard)
    fully_shard(model, mp_policy=mp, reshard_after_forward=reshard)
    if cfg.kind != "hipress":
        return None
    import hipress.fsdp

    return hipress.fsdp.register(model, cfg.algorithm or "onebit", feedback=cfg.feedback)


def _train(
    rank: int, world_size: int, model_name: str, data: Any, cfg: FsdpConfig, warmup: int,
    steps: int, lr: float, iface: str, reshard: bool,
) -> dict[str, Any]:  # fmt: skip
    w = WORKLOADS[model_name]
    # the LSTM returns a view; nothing here modifies it in place
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
    model = w.build(data)
    comp = _shard(model, model_name, cfg, reshard)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses: list[float] = []

    def step(i: int) -> None:
        x, y = w.batch(data, rank, i)
        opt.zero_grad()
        loss = w.loss(model, x, y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))

    for i in range(warmup):
        step(i)
    dist.barrier()
    tx0, t0 = tx_bytes(iface), time.perf_counter()
    for i in range(warmup, warmup + steps):
        step(i)
    seconds = time.perf_counter() - t0
    tx1 = tx_bytes(iface)
    dist.barrier()
    shard = sum(p.to_local().numel() * p.to_local().element_size() for p in model.parameters())
    memory = {"params_shard": shard, "grads_shard": shard, "feedback": 0, "state": 0}
    if comp is not None:
        memory.update({k: v for k, v in comp.memory().items() if k != "params_shard"})
    memory["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "seconds": seconds,
        "tx_bytes": None if tx0 is None or tx1 is None else tx1 - tx0,
        "losses": losses,
        "memory": memory,
        "units": None
        if comp is None
        else {k: [u.numel, u.compress] for k, u in comp.units.items()},
    }


def run_config(net: Network, data: Any, cfg: FsdpConfig, opts: FsdpOptions) -> dict[str, Any]:
    """One configuration on an entered network; ``{"config", "error"}`` if it failed."""
    w = WORKLOADS[opts.model]
    try:
        per_rank = run_in_network(
            net, _train, opts.model, data, cfg, opts.warmup, opts.steps, opts.lr, net.iface,
            opts.reshard_after_forward, timeout=opts.timeout, threads=opts.threads,
        )  # fmt: skip
    except Exception as exc:  # a failed configuration is a result to report
        logger.error("fsdp bench: %s failed: %s", cfg.name, exc)
        return {"config": cfg.name, "error": str(exc)[-2000:]}
    seconds = max(r["seconds"] for r in per_rank)
    tx = [r["tx_bytes"] for r in per_rank]
    wire = None if isinstance(net, LoopbackNetwork) or None in tx else tx
    return {
        "config": cfg.name,
        "describe": cfg.describe(),
        "samples_per_s": w.batch_size * opts.steps * net.world_size / seconds,
        "step_ms": 1000 * seconds / opts.steps,
        "wire_bytes_per_step": None if wire is None else sum(wire) / len(wire) / opts.steps,
        "final_loss": sum(r["losses"][-1] for r in per_rank) / len(per_rank),
        "memory_per_rank": {
            k: max(r["memory"][k] for r in per_rank) for k in per_rank[0]["memory"]
        },
        "units": per_rank[0]["units"],
    }


def run_fsdp(opts: FsdpOptions, progress: Any = None) -> dict[str, Any]:
    """Every configuration on every rate; returns ``{"meta", "cells"}``, a cell per rate with
    its rows (each with ``speedup`` over both baselines). Networks are always torn down."""
    w = WORKLOADS[opts.model]
    data = w.prepare()
    cells = []
    for rate in opts.rates_mbit:
        with open_network(opts.workers, rate, shaped=opts.shaped) as net:
            runs: dict[str, dict[str, Any]] = {}
            for rnd in range(opts.repeats):
                for cfg in configs_for(opts):
                    if progress is not None:
                        progress(f"{opts.model} | {net.label} | {cfg.name} | round {rnd + 1}")
                    res = run_config(net, data, cfg, opts)
                    best = runs.get(cfg.name)
                    if best is None or res.get("samples_per_s", 0) > best.get("samples_per_s", 0):
                        runs[cfg.name] = res
            rows = list(runs.values())
            base = {b.name: runs[b.name].get("samples_per_s") for b in BASELINES}
            for r in rows:
                if "samples_per_s" in r:
                    r["speedup"] = {k: r["samples_per_s"] / v for k, v in base.items() if v}
            cells.append({"model": opts.model, "network": net.as_dict(), "rows": rows})
        if isinstance(net, LoopbackNetwork):
            break  # every rate is the same unshaped loopback
    meta = {"torch": torch.__version__, "workers": opts.workers, "steps": opts.steps,
            "warmup": opts.warmup, "repeats": opts.repeats, "threads_per_worker": opts.threads,
            "reshard_after_forward": opts.reshard_after_forward,
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), **opts.extra}  # fmt: skip
    return {"meta": meta, "cells": cells}


def fsdp_markdown(results: dict[str, Any]) -> str:
    """The results as markdown tables, one per cell (memory in MiB per rank)."""
    mib = 1 << 20
    out = []
    for cell in results["cells"]:
        reshard = "" if results["meta"].get("reshard_after_forward", True) else ", no reshard"
        out.append(f"\n### {cell['model']}, {results['meta']['workers']} workers, "
                   f"{cell['network'].get('label', '')}{reshard}\n")  # fmt: skip
        out.append("| configuration | samples/s | step ms | vs fp32 | vs bf16 | wire MB/step | "
                   "param shard MiB | feedback MiB | state MiB | peak RSS MiB | loss |")  # fmt: skip
        out.append("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in cell["rows"]:
            if "error" in r:
                out.append(f"| {r['config']} | failed: {r['error'][-80:]} |")
                continue
            m, sp = r["memory_per_rank"], r.get("speedup", {})
            wire = r["wire_bytes_per_step"]
            out.append(
                f"| {r['config']} | {r['samples_per_s']:.1f} | {r['step_ms']:.0f} | "
                f"{sp.get('fsdp-fp32', 0):.2f}x | {sp.get('fsdp-bf16-reduce', 0):.2f}x | "
                f"{'-' if wire is None else f'{wire / 1e6:.1f}'} | {m['params_shard'] / mib:.1f} | "
                f"{m['feedback'] / mib:.1f} | {m['state'] / mib:.1f} | "
                f"{m['peak_rss'] / mib:.0f} | {r['final_loss']:.3f} |"
            )
    return "\n".join(out) + "\n"
