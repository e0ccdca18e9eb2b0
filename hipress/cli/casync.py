"""The CaSync command ``hipress bench sync``: time gradient synchronisation per method, size and
world size (:mod:`hipress.bench.sync`); print a table and write ``hipress-results/sync.json``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from hipress.cli.args import RESULTS, parse_rate_mbit, positive
from hipress.cli.options import CommaList, add_alias

__all__ = ["add_bench_sync_parser", "add_sync_arguments", "run_bench_sync"]

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "M": 1 << 20, "MB": 1 << 20, "G": 1 << 30}


def _size(text: str) -> int:
    """``1K``, ``64MB``, ``4096`` -> bytes."""
    t = text.strip().upper()
    num = t.rstrip("KMGB")
    try:
        value = int(float(num) * _UNITS[t[len(num) :]])
    except (KeyError, ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"bad size {text!r}: use e.g. 1K, 256KB, 64M") from None
    if value < 8 or value % 4:
        raise argparse.ArgumentTypeError(f"size {text!r} must be >= 8 bytes, a multiple of 4")
    return value


def _rate(text: str) -> float | None:
    """The deprecated ``--rates`` format: ``loopback`` or Mbit/s (``1000``, ``1000mbit``)."""
    t = text.strip().lower()
    if t in ("loopback", "none"):
        return None
    try:
        return float(t.removesuffix("mbit"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"bad rate {text!r}: 'loopback' or Mbit/s like 1000"
        ) from None


def add_sync_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``hipress bench sync``; lists are comma-separated."""
    p.add_argument("--workers", action=CommaList, item=positive, default=[2, 4], metavar="N,..",
                   help="local worker counts, e.g. 2,4,8 (default 2,4)")  # fmt: skip
    add_alias(p, "--world-sizes", "workers", "--workers 2,4", type=int, nargs="+", metavar="N")
    p.add_argument(
        "--sizes",
        action=CommaList,
        item=_size,
        default=[_size(s) for s in ("1K", "16K", "256K", "4M", "64M", "256M")],
        metavar="SIZE,..",
        help="tensor sizes (float32), e.g. 1K,64M (default 1K .. 256M)",
    )
    p.add_argument(
        "--algorithms",
        action=CommaList,
        default=["onebit", "terngrad"],
        metavar="ALG,..",
        help="CompLL algorithms, default parameters (see `hipress algorithms`)",
    )
    p.add_argument(
        "--strategies",
        action=CommaList,
        default=["allgather", "ps", "ring"],
        choices=["allgather", "ps", "ring"],
        metavar="S,..",
        help="CaSync strategies: allgather, ps, ring (default all three)",
    )
    p.add_argument(
        "--partitions",
        action=CommaList,
        item=positive,
        default=[1, 2, 4],
        metavar="K,..",
        help="pipelined partitions (K > 1 only where each partition keeps >= 64K elements)",
    )
    p.add_argument("--reps", type=int, default=5, help="timed repetitions per cell (at most)")
    p.add_argument("--budget", type=float, default=5.0, help="seconds of timing per cell (soft)")
    p.add_argument(
        "--bandwidth",
        action=CommaList,
        item=parse_rate_mbit,
        dest="rates",
        default=[None],
        metavar="RATE,..",
        help="networks: loopback and/or per-worker rates of shaped links, e.g. "
        "loopback,1gbit (shaping needs root; default loopback)",
    )
    add_alias(p, "--rates", "rates", "--bandwidth loopback,1gbit", type=_rate, nargs="+")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--backend", default="auto", help="CompLL backend")
    p.add_argument(
        "--out", type=Path, default=Path(RESULTS) / "sync.json", help="JSON results file"
    )
    p.add_argument("--quick", action="store_true", help="small sizes, 1 rep: a smoke run")


def run_bench_sync(args: argparse.Namespace) -> int:
    """Handler: run, print the table, write the JSON. Returns the exit code."""
    from hipress.bench.provenance import stamp
    from hipress.bench.report import write_json
    from hipress.bench.sync import SyncBenchConfig, format_table, run_sync_bench

    sizes = [s for s in args.sizes if s <= 256 << 10] if args.quick else args.sizes
    try:
        cfg = SyncBenchConfig(
            world_sizes=tuple(args.workers),
            sizes=tuple(sizes),
            algorithms=tuple(args.algorithms),
            strategies=tuple(args.strategies),
            partitions=tuple(args.partitions),
            reps=1 if args.quick else args.reps,
            budget_s=args.budget,
            rates_mbit=tuple(args.rates),
            threads=args.threads,
            backend=args.backend,
            extra={"command": getattr(args, "invocation", "hipress bench sync")},
        )
    except ValueError as exc:
        print(f"hipress bench sync: {exc}", file=sys.stderr)
        return 2

    def progress(text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)

    results: dict[str, Any] = run_sync_bench(cfg, progress=progress)
    print(format_table(results))
    write_json(stamp(results, cfg.extra["command"]), args.out)
    print(f"\nwrote {args.out}")
    return 0


def add_bench_sync_parser(bench_subparsers: Any) -> argparse.ArgumentParser:
    """Add ``sync`` to the ``hipress bench`` sub-command group; its handler is ``func``."""
    p = bench_subparsers.add_parser(
        "sync", help="time one gradient sync: DDP allreduce vs CaSync strategies"
    )
    add_sync_arguments(p)
    p.set_defaults(func=run_bench_sync)
    return p
