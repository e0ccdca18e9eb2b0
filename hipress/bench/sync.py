"""``hipress bench sync``: time one gradient synchronisation per method, tensor size and world
size.

Methods: ``ddp_allreduce`` (what DDP does: divide, allreduce in place), ``fp16_allreduce``
(PyTorch's ``fp16_compress_hook``: cast, allreduce, cast back), and CaSync with each algorithm,
strategy (allgather, ps, ring) and partition count K, through :meth:`CaSyncState.submit` (the same path
as the DDP hook). Each cell is timed as the slowest rank's wall time per sync (median over
repetitions, after a warm-up that allocates the buffers), with the input refilled before each
repetition outside the timing.

Workers run through :func:`hipress.bench.netsim.run_in_network`: on loopback, or, as root, in network
namespaces with rate-shaped links (``rates_mbit``).
"""

from __future__ import annotations

import logging
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from hipress.casync.state import CaSyncState
from hipress.core.plan import Plan, Strategy, TensorPlan

__all__ = ["SyncBenchConfig", "run_sync_bench"]

logger = logging.getLogger(__name__)

KB, MB = 1 << 10, 1 << 20


@dataclass(frozen=True)
class SyncBenchConfig:
    """What to measure.

    Fields:
        world_sizes: numbers of local workers.
        sizes: tensor sizes in bytes (float32).
        algorithms: CompLL algorithm names (default parameters).
        strategies: CaSync strategies ("allgather", "ps", "ring").
        partitions: K values; K > 1 only where every partition keeps ``min_partition_numel``.
        reps: timed repetitions per cell (at most).
        budget_s: stop repeating a cell once its timed repetitions took this long (>= 1 rep).
        rates_mbit: networks: None for loopback, a number for namespaces shaped to that rate
            (needs root; falls back to loopback with a label saying so).
        threads: torch threads per worker.
        backend: CompLL backend.
        min_partition_numel: see ``partitions``.
    """

    world_sizes: tuple[int, ...] = (2, 4)
    sizes: tuple[int, ...] = (KB, 16 * KB, 256 * KB, 4 * MB, 64 * MB, 256 * MB)
    algorithms: tuple[str, ...] = ("onebit", "terngrad")
    strategies: tuple[str, ...] = ("allgather", "ps", "ring")
    partitions: tuple[int, ...] = (1, 2, 4)
    reps: int = 5
    budget_s: float = 5.0
    rates_mbit: tuple[float | None, ...] = (None,)
    threads: int = 1
    backend: str = "auto"
    min_partition_numel: int = 1 << 16
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.world_sizes or min(self.world_sizes) < 2:
            raise ValueError("world_sizes must be >= 2")
        if not self.sizes or min(self.sizes) < 8 or any(s % 4 for s in self.sizes):
            raise ValueError("sizes must be >= 8 bytes and whole float32 tensors")
        bad = set(self.strategies) - {"allgather", "ps", "ring"}
        if bad:
            raise ValueError(f"unknown strategies {sorted(bad)}; use allgather, ps, ring")
        if not self.partitions or min(self.partitions) < 1:
            raise ValueError("partitions must be >= 1")
        if self.reps < 1 or self.budget_s <= 0:
            raise ValueError("reps must be >= 1 and budget_s > 0")


def _methods(cfg: SyncBenchConfig, numel: int, world_size: int) -> list[tuple[str, str, int]]:
    """(algorithm, strategy, K) cells for one size; baselines have algorithm ''."""
    out = [("", "ddp_allreduce", 1), ("", "fp16_allreduce", 1)]
    for alg in cfg.algorithms:
        for strategy in cfg.strategies:
            for k in cfg.partitions:
                fits = k == 1 or numel // k >= cfg.min_partition_numel
                if fits and numel // k >= world_size:
                    out.append((alg, strategy, k))
    return out


def _slowest(seconds: float, group: Any = None) -> float:
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t)


def _time_cell(
    run: Callable[[], Any], refill: Callable[[], None], cfg: SyncBenchConfig
) -> list[float]:
    """Warm up once, then time ``run`` up to ``cfg.reps`` times (slowest rank, seconds); every
    rank takes the same decisions because they use the all-reduced times."""
    refill()
    run()
    times: list[float] = []
    while len(times) < cfg.reps and sum(times) < cfg.budget_s:
        refill()
        dist.barrier()
        t = time.perf_counter()
        run()
        times.append(_slowest(time.perf_counter() - t))
    return times


def _worker(rank: int, world_size: int, cfg: SyncBenchConfig) -> list[dict[str, Any]]:
    from hipress.compll import load

    algorithms = {name: load(name, backend=cfg.backend) for name in cfg.algorithms}
    rows: list[dict[str, Any]] = []
    gen = torch.Generator().manual_seed(rank)
    for nbytes in cfg.sizes:
        numel = nbytes // 4
        grads = torch.randn(numel, generator=gen)
        buf = torch.empty_like(grads)
        half = torch.empty(numel, dtype=torch.float16)

        def refill(buf: torch.Tensor = buf, grads: torch.Tensor = grads) -> None:
            buf.copy_(grads)

        for alg_name, method, k in _methods(cfg, numel, world_size):
            state: CaSyncState | None = None
            if method == "ddp_allreduce":

                def run(buf: torch.Tensor = buf) -> None:
                    dist.all_reduce(buf.div_(world_size))

            elif method == "fp16_allreduce":

                def run(buf: torch.Tensor = buf, half: torch.Tensor = half) -> None:
                    dist.all_reduce(half.copy_(buf).div_(world_size))
                    buf.copy_(half)

            else:
                alg = algorithms[alg_name]
                entry = TensorPlan("t", numel, True, Strategy(method), k)
                plan = Plan(alg.name, dict(alg.params), world_size, (entry,))
                state = CaSyncState(alg, named_parameters=[("t", numel)], plan=plan, log_every=0)

                def run(buf: torch.Tensor = buf, state: CaSyncState = state) -> None:
                    state.submit(buf, ["t"], last=True).wait()

            times = _time_cell(run, refill, cfg)
            row: dict[str, Any] = {
                "world_size": world_size,
                "bytes": nbytes,
                "numel": numel,
                "method": method if not alg_name else f"{alg_name}/{method}/K{k}",
                "algorithm": alg_name or None,
                "strategy": method,
                "partitions": k,
                "reps": len(times),
                "ms": 1e3 * statistics.median(times),
                "ms_min": 1e3 * min(times),
                "ms_max": 1e3 * max(times),
            }
            if state is not None and state.stats.steps:
                means = state.stats.mean(last=len(times))  # not the warm-up
                row.update(
                    ratio=means["ratio"],
                    encode_ms=means["encode_ms"],
                    decode_ms=means["decode_ms"],
                    comm_ms=means["comm_ms"],
                )
            elif method == "fp16_allreduce":
                row["ratio"] = 0.5
            else:
                row["ratio"] = 1.0
            if rank == 0:
                logger.info(
                    "N=%d %s %s: %.3f ms", world_size, _human(nbytes), row["method"], row["ms"]
                )
            rows.append(row)
        del grads, buf, half
    return rows


def _human(nbytes: int) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", MB), ("KB", KB)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


def run_sync_bench(
    cfg: SyncBenchConfig, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Run every cell of ``cfg``; returns the JSON-able results (``rows`` plus metadata, with
    each row's ``speedup`` over ``ddp_allreduce`` in the same network, world size and size)."""
    from hipress.bench.netsim import open_network, run_in_network

    rows: list[dict[str, Any]] = []
    networks: list[dict[str, Any]] = []
    for rate in cfg.rates_mbit:
        for n in cfg.world_sizes:
            with open_network(n, rate, shaped=rate is not None) as net:
                if progress:
                    progress(f"N={n} on {net.label}")
                got = run_in_network(net, _worker, cfg, threads=cfg.threads, timeout=24 * 3600.0)[0]
                for r in got:
                    r["network"] = net.label
                rows += got
                networks.append(net.as_dict())
    base = {
        (r["network"], r["world_size"], r["bytes"]): r["ms"]
        for r in rows
        if r["method"] == "ddp_allreduce"
    }
    for r in rows:
        r["speedup"] = base[(r["network"], r["world_size"], r["bytes"])] / r["ms"]
    return {
        "benchmark": "sync",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": {
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
        },
        "config": {k: v for k, v in asdict(cfg).items() if k != "extra"} | cfg.extra,
        "networks": networks,
        "rows": rows,
    }


def format_table(results: dict[str, Any], methods: Sequence[str] | None = None) -> str:
    """A plain-text table of ``results`` (one block per network and world size)."""
    lines: list[str] = []
    rows = results["rows"]
    keys = sorted({(r["network"], r["world_size"]) for r in rows}, key=lambda x: (x[0], x[1]))
    for network, n in keys:
        block = [r for r in rows if r["network"] == network and r["world_size"] == n]
        lines.append(f"\n== {n} workers, {network} ==")
        head = f"{'size':>9}  {'method':<26} {'ms':>10} {'x DDP':>7} {'sent %':>6}"
        head += f" {'enc ms':>8} {'comm ms':>8} {'dec ms':>8}"
        lines.append(head)
        for r in block:
            if methods and r["method"] not in methods:
                continue
            extra = "".join(
                f" {r[k]:8.2f}" if k in r else f" {'':>8}"
                for k in ("encode_ms", "comm_ms", "decode_ms")
            )
            lines.append(
                f"{_human(r['bytes']):>9}  {r['method']:<26} {r['ms']:10.3f} "
                f"{r['speedup']:7.2f} {100 * r['ratio']:6.1f}" + extra
            )
    return "\n".join(lines)
