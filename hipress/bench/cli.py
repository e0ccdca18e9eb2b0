"""``hipress bench e2e`` and ``hipress bench convergence``: run, print a table, write
``bench/results/``. Registered in :mod:`hipress.cli` through its extension list."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

__all__ = ["add_parsers"]


def _floats(text: str) -> tuple[float | None, ...]:
    out: list[float | None] = []
    for item in text.split(","):
        item = item.strip().lower()
        if item in ("none", "unshaped"):
            out.append(None)
            continue
        scale = 1000.0 if item.endswith("g") else 1.0
        out.append(float(item.rstrip("gm")) * scale)
    return tuple(out)


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _sigterm_as_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # so the network context managers tear everything down


def _command() -> str:
    return " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])


def _progress(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def _cmd_e2e(args: argparse.Namespace) -> int:
    from hipress.bench.e2e import E2EOptions, run_matrix
    from hipress.bench.report import e2e_markdown, e2e_png, write_json
    from hipress.netsim import shaping_unavailable_reason

    reason = shaping_unavailable_reason() if not args.loopback else "--loopback given"
    if reason is not None:
        print(
            f"WARNING: no shaped network ({reason}); running on UNSHAPED LOOPBACK: the figures "
            "say nothing about a real cluster's network and are labelled so.",
            file=sys.stderr,
        )
    opts = E2EOptions(
        workers=args.workers,
        rates_mbit=_floats(args.rates),
        models=_names(args.models),
        algorithms=_names(args.algorithms),
        plan=None if args.plan == "default" else args.plan,
        steps=args.steps,
        warmup=args.warmup,
        repeats=args.repeats,
        threads=args.threads,
        powersgd_rank=args.powersgd_rank,
        shaped=not args.loopback,
        extra={"command": _command()},
    )
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    results = run_matrix(opts, progress=_progress)
    out = Path(args.out)
    write_json(results, out / f"{args.name}.json")
    md = e2e_markdown(results)
    (out / f"{args.name}.md").write_text(md)
    png = e2e_png(results, out / f"{args.name}.png")
    print(md)
    print(f"wrote {out / args.name}.json, .md" + (", .png" if png else ""))
    return 0


def _cmd_convergence(args: argparse.Namespace) -> int:
    from hipress.bench.convergence import ConvergenceOptions, run_convergence
    from hipress.bench.report import write_json

    opts = ConvergenceOptions(
        workers=args.workers,
        algorithms=_names(args.algorithms),
        epochs=args.epochs,
        train_tokens=args.train_tokens,
        plan=None if args.plan == "default" else args.plan,
        threads=args.threads,
        warmup_steps=args.warmup_steps,
        density_warmup_epochs=args.density_warmup_epochs,
        clip=args.clip,
    )
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    results = run_convergence(opts, progress=_progress)
    results["meta"]["command"] = _command()
    out = Path(args.out)
    write_json(results, out / "convergence.json")
    from hipress.bench.convergence import convergence_markdown

    md = convergence_markdown(results)
    (out / "convergence.md").write_text(md)
    print(md)
    print(f"wrote {out}/convergence.json, .md")
    return 0


def add_parsers(sub: Any, bench_sub: Any) -> None:
    """Add ``bench e2e`` and ``bench convergence`` to the ``hipress`` parser."""
    default_out = os.path.join("bench", "results")
    e = bench_sub.add_parser(
        "e2e",
        help="training throughput on a shaped network (needs root; else labelled loopback)",
        description="Each worker in its own network namespace with a tc-shaped NIC; DDP fp32, "
        "fp16_compress_hook and powerSGD_hook against hipress with each algorithm under its "
        "SeCoPa plan. Writes NAME.json, NAME.md and NAME.png.",
    )
    e.add_argument("--workers", type=int, default=4)
    e.add_argument("--rates", default="1g,10g", help="NIC rates: 100m, 1g, 10g, none (unshaped)")
    e.add_argument("--models", default="lstm-lm,resnet")
    e.add_argument("--algorithms", default="onebit,tbq,terngrad,dgc,graddrop")
    e.add_argument("--plan", default="auto", help="auto (SeCoPa), default (CaSync's rule), FILE")
    e.add_argument("--steps", type=int, default=10, help="timed steps per configuration")
    e.add_argument("--warmup", type=int, default=3, help="untimed steps first (>= 3)")
    e.add_argument("--repeats", type=int, default=2, help="rounds; each config keeps its best")
    e.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    e.add_argument("--powersgd-rank", type=int, default=4)
    e.add_argument("--loopback", action="store_true", help="skip namespaces: unshaped loopback")
    e.add_argument("--out", default=default_out)
    e.add_argument("--name", default="e2e", help="basename of the result files")
    e.set_defaults(func=_cmd_e2e)

    c = bench_sub.add_parser(
        "convergence",
        help="final accuracy of every algorithm (with its error feedback) vs uncompressed",
    )
    c.add_argument("--workers", type=int, default=4)
    c.add_argument("--algorithms", default="all", help="comma list, or all shipped algorithms")
    c.add_argument("--epochs", type=int, default=2)
    c.add_argument("--train-tokens", type=int, default=160_000, help="training tokens per epoch")
    c.add_argument("--plan", default="default", help="auto (SeCoPa), default, FILE")
    c.add_argument("--threads", type=int, default=1)
    c.add_argument(
        "--warmup-steps", type=int, default=0, help="CaSync's uncompressed warm-up steps"
    )
    c.add_argument(
        "--density-warmup-epochs",
        type=int,
        default=0,
        metavar="E",
        help="sparsifiers send 25%%, 6.25%%, ... (4x less each epoch) until their own fraction "
        "for the first E epochs, as DGC's warm-up does",
    )
    c.add_argument(
        "--clip", type=float, default=1.0, help="gradient norm clipping after the sync (0: none)"
    )
    c.add_argument("--out", default=default_out)
    c.set_defaults(func=_cmd_convergence)
