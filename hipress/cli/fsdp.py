"""``hipress bench fsdp``: FSDP2 throughput and per-rank memory, plain against hipress's
compressed reduce-scatter (:mod:`hipress.bench.fsdp`). Prints a table and writes
``NAME.json`` and ``NAME.md`` under ``--out``."""

from __future__ import annotations

import argparse
from typing import Any

from hipress.cli.args import RESULTS, parse_rate_mbit
from hipress.cli.options import CommaList
from hipress.cli.progress import invocation, step_line, warn_if_unshaped, write_report

__all__ = ["add_fsdp_parser"]


def _cmd_fsdp(args: argparse.Namespace) -> int:
    from hipress.bench.fsdp import FsdpOptions, fsdp_markdown, run_fsdp
    from hipress.bench.provenance import stamp

    warn_if_unshaped(args.loopback)
    command = invocation(args)
    opts = FsdpOptions(
        workers=args.workers, rates_mbit=tuple(args.rates), model=args.model,
        variants=tuple(v.strip() for v in args.variants.split(",") if v.strip()),
        steps=args.steps, warmup=args.warmup, repeats=args.repeats, threads=args.threads,
        shaped=not args.loopback, reshard_after_forward=not args.no_reshard,
        extra={"command": command},
    )  # fmt: skip
    results = stamp(run_fsdp(opts, progress=step_line), command)
    write_report(results, args.out, args.name, fsdp_markdown(results))
    return 0


def add_fsdp_parser(bench_sub: Any) -> None:
    """Add ``fsdp`` to the ``hipress bench`` group."""
    f = bench_sub.add_parser(
        "fsdp",
        help="FSDP2 throughput and per-rank memory: plain, bf16 reduce, hipress",
        description="Each worker in its own network namespace with a tc-shaped NIC (needs root; "
        "else labelled loopback): FSDP2 with a float32 and a bfloat16 reduce-scatter against "
        "hipress's compressed reduce-scatter with each ALGORITHM:FEEDBACK variant.",
    )
    f.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
    f.add_argument("--bandwidth", action=CommaList, item=parse_rate_mbit, dest="rates",
                   default=[1000.0], metavar="RATE,..",
                   help="NIC rates, e.g. 1gbit,10gbit or loopback; default 1gbit")  # fmt: skip
    f.add_argument("--model", default="lstm-lm", help="lstm-lm (default) or resnet")
    f.add_argument("--variants", default="onebit:fp32,onebit:bf16,terngrad:none,signsgd:int8",
                   help="ALGORITHM:FEEDBACK, comma-separated")  # fmt: skip
    f.add_argument("--steps", type=int, default=5, help="timed steps per configuration")
    f.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    f.add_argument("--repeats", type=int, default=1, help="rounds; each config keeps its best")
    f.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    f.add_argument("--loopback", action="store_true", help="skip namespaces: unshaped loopback")
    f.add_argument("--no-reshard", action="store_true",
                   help="reshard_after_forward=False: one parameter all-gather per step, not two")  # fmt: skip
    f.add_argument("--out", default=RESULTS, help="directory for the result files")
    f.add_argument("--name", default="fsdp", help="basename of the result files")
    f.set_defaults(func=_cmd_fsdp)
