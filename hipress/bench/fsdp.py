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
compression state (of which error feedback) and the process's peak resident memory; and the
bytes each collective should put on the wire per step (``traffic``: payload only, from the units'
sizes and dtypes, and for hipress the compressed reduce-scatter's own count), to hold against the
measured ``wire_bytes_per_step``. :func:`measure` runs one configuration; ``hipress bench e2e
--fsdp`` uses it for its FSDP2 rows.
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

from hipress.bench.netsim import (
    LoopbackNetwork,
    Network,
    open_network,
    run_in_network,
    tx_bytes,
)
from hipress.bench.workloads import WORKLOADS
from hipress.core.torchcompat import fsdp_param_groups

__all__ = [
    "BASELINES",
    "BF16_PARAMS",
    "FsdpConfig",
    "FsdpOptions",
    "configs_for",
    "derive_speedups",
    "fsdp_markdown",
    "measure",
    "run_fsdp",
]

logger = logging.getLogger(__name__)

# blocks used outside their own forward (LSTMLM.forward sums out.tail's parameters; the tied
# GPT's head computes with embed's matrix) stay in the root unit: FSDP2 has resharded a block's
# parameters once its forward returns
_ROOT_HELD = {"lstm-lm": ("out",), "gpt": ("embed",)}


@dataclass(frozen=True)
class FsdpConfig:
    """One way to reduce gradients: ``kind`` "fsdp" (``reduce`` "fp32" or "bf16") or "hipress"
    (``algorithm`` with ``feedback``). ``params`` "bf16" is the user's own
    ``MixedPrecisionPolicy(param_dtype=torch.bfloat16)``: parameters all-gathered and computed
    with in bfloat16 (then ``reduce`` should be "bf16" too, FSDP2's default for that policy)."""

    name: str
    kind: str
    reduce: str = "fp32"
    algorithm: str | None = None
    feedback: str = "auto"
    params: str = "fp32"

    def __post_init__(self) -> None:
        for what, v in (("reduce", self.reduce), ("params", self.params)):
            if v not in _DTYPES:
                raise ValueError(f"{what} must be one of {sorted(_DTYPES)}, got {v!r}")

    def describe(self) -> str:
        prec = ", bf16 params" if self.params == "bf16" else ""
        if self.kind == "fsdp":
            return f"FSDP2{prec}, {self.reduce} reduce-scatter"
        return f"hipress {self.algorithm} over FSDP2{prec}, feedback {self.feedback}"

    def policy(self) -> Any:
        """The ``MixedPrecisionPolicy`` of this configuration (a dtype equal to the one it
        follows is left None, as FSDP2 itself clamps it)."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        param = None if self.params == "fp32" else _DTYPES[self.params]
        reduce = None if self.reduce == self.params else _DTYPES[self.reduce]
        return MixedPrecisionPolicy(param_dtype=param, reduce_dtype=reduce)


_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
BASELINES = (FsdpConfig("fsdp-fp32", "fsdp"), FsdpConfig("fsdp-bf16-reduce", "fsdp", "bf16"))
# the users' own bfloat16 mixed precision: all-gathers (and compute) in bf16 too
BF16_PARAMS = FsdpConfig("fsdp-bf16", "fsdp", "bf16", params="bf16")


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
    from torch.distributed.fsdp import fully_shard

    mp = cfg.policy()
    for name, child in model.named_children():
        if name in _ROOT_HELD.get(model_name, ()):
            continue
        # a container has no forward of its own to hook: its members are the units
        blocks = child.children() if isinstance(child, nn.ModuleList | nn.ModuleDict) else [child]
        for block in blocks:
            if any(True for _ in block.parameters()):
                fully_shard(block, mp_policy=mp, reshard_after_forward=reshard)
    fully_shard(model, mp_policy=mp, reshard_after_forward=reshard)
    if cfg.kind != "hipress":
        return None
    import hipress.fsdp

    return hipress.fsdp.register(model, cfg.algorithm or "onebit", feedback=cfg.feedback)


def _traffic(model: nn.Module, comp: Any, calls: int) -> dict[str, Any]:
    """Payload bytes this rank sends per step: each unit's all-gathers (once in forward, again
    in backward where the unit reshards after forward, as FSDP2 records it: with an explicit
    ``reshard_after_forward=True`` every unit, the root included) and its reduce-scatter, each
    sending N-1 of its N shards, in the dtypes of the policy; a hipress reduce-scatter's bytes
    are its own count over ``calls`` steps. ``gathers_per_unit``: [name, all-gathers]."""
    from torch.distributed.fsdp import FSDPModule

    ag = rs = 0.0
    units = []
    for name, m in model.named_modules():
        if not isinstance(m, FSDPModule):
            continue
        for g in fsdp_param_groups(m._get_fsdp_state()):
            peers = g.mesh_info.shard_mesh_size - 1
            gathers = 2 if g._reshard_after_forward else 1
            for fp in g.fsdp_params:
                n = fp.padded_sharded_param_size.numel()
                gather_dtype = fp.param_dtype or fp.orig_dtype
                ag += gathers * peers * n * gather_dtype.itemsize
                rs += peers * n * (fp.reduce_dtype or gather_dtype).itemsize
            units.append([name or "<root>", gathers])
    if comp is not None:
        rs = comp.stats()["sent_bytes"] / calls
    return {"allgather_bytes": ag, "reduce_scatter_bytes": rs, "total_bytes": ag + rs,
            "gathers_per_unit": units}  # fmt: skip


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
        "traffic": _traffic(model, comp, warmup + steps),
        "units": None
        if comp is None
        else {k: [u.numel, u.compress] for k, u in comp.units.items()},
    }


def measure(
    net: Network, model_name: str, data: Any, cfg: FsdpConfig, *, warmup: int, steps: int,
    lr: float, reshard: bool, timeout: float, threads: int,
) -> dict[str, Any]:  # fmt: skip
    """Run one configuration in fresh workers on an entered network. Returns its row:
    ``config``, ``describe``, ``reshard_after_forward``, ``samples_per_s`` (all workers, over
    the slowest rank's time), ``step_ms``, ``wire_bytes_per_step`` (measured per worker; None on
    loopback), ``traffic`` (expected payload bytes per worker and step, see :func:`_traffic`),
    ``final_loss``, ``memory_per_rank`` (the largest over ranks) and ``units``; or
    ``{"config", "error"}`` if it failed (a result to report, not a crash)."""
    w = WORKLOADS[model_name]
    try:
        per_rank = run_in_network(
            net, _train, model_name, data, cfg, warmup, steps, lr, net.iface, reshard,
            timeout=timeout, threads=threads,
        )  # fmt: skip
    except Exception as exc:  # a failed configuration is a result to report
        logger.error("fsdp: %s failed: %s", cfg.name, exc)
        return {"config": cfg.name, "reshard_after_forward": reshard, "error": str(exc)[-2000:]}
    seconds = max(r["seconds"] for r in per_rank)
    tx = [r["tx_bytes"] for r in per_rank]
    wire = None if isinstance(net, LoopbackNetwork) or None in tx else tx
    traffic = per_rank[0]["traffic"]
    traffic["reduce_scatter_bytes"] = max(r["traffic"]["reduce_scatter_bytes"] for r in per_rank)
    traffic["total_bytes"] = traffic["allgather_bytes"] + traffic["reduce_scatter_bytes"]
    return {
        "config": cfg.name,
        "describe": cfg.describe(),
        "reshard_after_forward": reshard,
        "params": cfg.params,
        "samples_per_s": w.batch_size * steps * net.world_size / seconds,
        "step_ms": 1000 * seconds / steps,
        "wire_bytes_per_step": None if wire is None else sum(wire) / len(wire) / steps,
        "traffic": traffic,
        "final_loss": sum(r["losses"][-1] for r in per_rank) / len(per_rank),
        "memory_per_rank": {
            k: max(r["memory"][k] for r in per_rank) for k in per_rank[0]["memory"]
        },
        "units": per_rank[0]["units"],
    }


def run_config(net: Network, data: Any, cfg: FsdpConfig, opts: FsdpOptions) -> dict[str, Any]:
    """One configuration of ``opts`` on an entered network (:func:`measure`)."""
    return measure(net, opts.model, data, cfg, warmup=opts.warmup, steps=opts.steps, lr=opts.lr,
                   reshard=opts.reshard_after_forward, timeout=opts.timeout,
                   threads=opts.threads)  # fmt: skip


def derive_speedups(rows: list[dict[str, Any]]) -> None:
    """Give every measured row ``speedup``: its samples/s over each FSDP2 baseline's among
    ``rows`` (fsdp-fp32, fsdp-bf16-reduce, and fsdp-bf16 where measured)."""
    names = [b.name for b in (*BASELINES, BF16_PARAMS)]
    base = {r["config"]: r["samples_per_s"] for r in rows if r["config"] in names
            and "samples_per_s" in r}  # fmt: skip
    for r in rows:
        if "samples_per_s" in r:
            r["speedup"] = {k: r["samples_per_s"] / v for k, v in base.items() if v}


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
            derive_speedups(rows)
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
        out.append("| configuration | samples/s | step ms | x fp32 | x bf16 | wire MB/step | "
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
