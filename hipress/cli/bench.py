"""The benchmark commands under ``hipress bench``: ``e2e``, ``convergence``, ``kernels``,
``costfit``, ``ring``, ``robustness`` and ``report`` (``sync`` is in :mod:`hipress.cli.casync`, ``plan`` in
:mod:`hipress.cli.secopa`). Each runs a benchmark of :mod:`hipress.bench`, prints a table and
writes its results under ``hipress-results/`` (``--out``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from hipress.cli.args import RESULTS, parse_latency, parse_rate_mbit
from hipress.cli.fsdp import add_fsdp_parser
from hipress.cli.options import CommaList, add_alias
from hipress.cli.progress import invocation, step_line, warn_if_unshaped, write_report

__all__ = [
    "add_e2e_parsers",
    "add_kernels_parser",
    "add_report_parser",
    "add_study_parsers",
]


def _floats(text: str) -> tuple[float | None, ...]:
    """The deprecated ``--rates`` format: ``100m,1g,10g,none`` -> Mbit/s (None: unshaped)."""
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


def _cmd_e2e(args: argparse.Namespace) -> int:
    from hipress.bench.e2e import E2EOptions, run_matrix
    from hipress.bench.e2e_caps import parse_caps
    from hipress.bench.provenance import stamp
    from hipress.bench.report import e2e_breakdowns, e2e_markdown, e2e_png, write_json

    warn_if_unshaped(args.loopback)
    opts = E2EOptions(
        workers=args.workers,
        rates_mbit=tuple(args.rates),
        models=_names(args.models),
        algorithms=_names(args.algorithms),
        plans=tuple(None if x == "default" else x for x in _names(args.plan)),
        include=_names(args.include),
        steps=args.steps,
        warmup=args.warmup,
        repeats=args.repeats,
        threads=args.threads,
        powersgd_rank=args.powersgd_rank,
        shaped=not args.loopback,
        trace_dir=None if args.no_trace else str(Path(args.out) / f"{args.name}-traces"),
        fsdp=args.fsdp,
        fsdp_reshard=_RESHARD[args.fsdp_reshard],
        fsdp_bf16_params=args.fsdp_bf16_params,
        local_steps=_names(args.local_steps),
        row_sparse=_names(args.rows),
        bucket_caps=parse_caps(args.bucket_cap_mb),
        extra={"command": invocation(args)},
    )
    results = stamp(run_matrix(opts, progress=step_line), invocation(args))
    out = Path(args.out)
    write_json(results, out / f"{args.name}.json")
    md = e2e_markdown(results) + e2e_breakdowns(results)
    (out / f"{args.name}.md").write_text(md)
    png = e2e_png(results, out / f"{args.name}.png")
    print(md)
    print(f"wrote {out / args.name}.json, .md" + (", .png" if png else ""))
    if opts.trace_dir is not None:
        print(f"step timelines in {opts.trace_dir} (hipress trace FILES: breakdown and PNG)")
    return 0


_RESHARD = {"on": (True,), "off": (False,), "both": (True, False)}


def _cmd_convergence(args: argparse.Namespace) -> int:
    from hipress.bench.convergence import ConvergenceOptions, check_convergence, run_convergence
    from hipress.bench.provenance import stamp

    try:
        opts = ConvergenceOptions(
            workers=args.workers,
            algorithms=_names(args.algorithms),
            epochs=args.epochs,
            task=args.task,
            seeds=tuple(range(args.seeds)),
            train_tokens=args.train_tokens,
            train_samples=args.train_samples,
            batch=args.batch,
            lr=args.lr,
            lr_schedule=args.lr_schedule,
            plan=None if args.plan == "default" else args.plan,
            include=_names(args.include),
            threads=args.threads,
            warmup_steps=args.warmup_steps,
            warmup_epochs=args.warmup_epochs,
            density_warmup_epochs=args.density_warmup_epochs,
            clip=args.clip,
            fsdp=args.fsdp,
            fsdp_feedback=args.fsdp_feedback,
            local_steps=_names(args.local_steps),
            local_epochs=args.local_epochs,
            rate_mbit=args.rate_mbit,
            row_sparse=_names(args.rows),
        )
        check_convergence(opts)
    except ValueError as exc:
        print(f"hipress bench convergence: {exc}", file=sys.stderr)
        return 2
    results = run_convergence(opts, progress=step_line)
    results["meta"]["command"] = invocation(args)
    stamp(results, invocation(args))
    name = "convergence-fsdp" if args.fsdp else "convergence"
    if args.task != "lm":
        name = f"{name}-{args.task}"
    from hipress.bench.convergence import convergence_markdown

    write_report(results, args.out, name, convergence_markdown(results))
    return 0


def add_e2e_parsers(bench_sub: Any) -> None:
    """Add ``e2e``, ``convergence`` and ``fsdp`` to the ``hipress bench`` group."""
    _add_e2e_parser(bench_sub)
    _add_convergence_parser(bench_sub)
    add_fsdp_parser(bench_sub)  # hipress bench fsdp


def _add_e2e_parser(bench_sub: Any) -> None:
    e = bench_sub.add_parser(
        "e2e",
        help="training throughput on a shaped network (needs root; else labelled loopback)",
        description="Each worker in its own network namespace with a tc-shaped NIC; DDP fp32, "
        "fp16_compress_hook and powerSGD_hook against hipress with each algorithm under its "
        "SeCoPa plan; with --fsdp also FSDP2 (fp32 and bf16 reduce-scatter) against hipress's "
        "compressed reduce-scatter. Writes NAME.json, NAME.md and NAME.png.",
    )
    e.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
    e.add_argument("--bandwidth", action=CommaList, item=parse_rate_mbit, dest="rates",
                   default=[1000.0, 10000.0], metavar="RATE,..",
                   help="NIC rates, e.g. 100mbit,1gbit,10gbit or loopback (unshaped); "
                   "default 1gbit,10gbit")  # fmt: skip
    add_alias(e, "--rates", "rates", "--bandwidth 1gbit,10gbit", convert=_floats)
    e.add_argument("--models", default="lstm-lm,resnet",
                   help="models, comma-separated: lstm-lm, gpt (GPT-2-style, tied "
                   "embeddings), gpt-untied, resnet (default lstm-lm,resnet)")  # fmt: skip
    e.add_argument("--algorithms", default="onebit,tbq,terngrad,dgc,graddrop",
                   help="CompLL algorithms, comma-separated")  # fmt: skip
    e.add_argument("--plan", default="auto", metavar="PLAN,..", help="auto (SeCoPa), default "
                   "(CaSync's rule), FILE; several: a row each, hipress-ALG-PLAN after the first")  # fmt: skip
    e.add_argument("--include", default="", metavar="PATTERN,..",
                   help="also hipress-ALGORITHM-include rows: register(include=...) with these "
                   "parameter names or patterns, so that they may be compressed too (a tied "
                   "embedding's dense gradient, which plans keep plain)")  # fmt: skip
    e.add_argument("--steps", type=int, default=10, help="timed steps per configuration")
    e.add_argument("--warmup", type=int, default=6,
                   help="untimed steps first (>= 3; 6 keeps CaSync's plan check untimed)")
    e.add_argument("--repeats", type=int, default=2, help="rounds; each config keeps its best")
    e.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    e.add_argument("--powersgd-rank", type=int, default=4, help="rank of the powerSGD baseline")
    e.add_argument("--loopback", action="store_true", help="skip namespaces: unshaped loopback")
    e.add_argument("--no-trace", action="store_true",
                   help="keep no step timeline (default: one per configuration, in "
                   "OUT/NAME-traces/)")  # fmt: skip
    e.add_argument("--fsdp", action="store_true",
                   help="also FSDP2 rows: plain (fp32 reduce-scatter), bf16 reduce-scatter, and "
                   "hipress's compressed reduce-scatter with each algorithm, with memory per "
                   "rank")  # fmt: skip
    e.add_argument("--fsdp-reshard", choices=tuple(_RESHARD), default="on",
                   help="FSDP2's reshard_after_forward: on (True: each unit all-gathered before "
                   "forward and again before backward), off (False: once), both (a block of "
                   "rows each); default on")  # fmt: skip
    e.add_argument("--fsdp-bf16-params", action="store_true",
                   help="also FSDP2 with MixedPrecisionPolicy(param_dtype=bfloat16), plain and "
                   "with each algorithm (bf16 all-gathers and compute)")  # fmt: skip
    e.add_argument("--local-steps", default="", metavar="VARIANT,..",
                   help="also local-step rows: diloco-ALGORITHM-hH (none: uncompressed), "
                   "postlocal-hH (PyTorch's post-local SGD), torchft-hH, or hH for all of "
                   "them at H with each of --algorithms")  # fmt: skip
    e.add_argument("--rows", default="", metavar="ALGORITHM,..",
                   help="also row-sparse rows: hipress-ALGORITHM-rows, the default rule's plan "
                   "with the embeddings sent as their touched rows from the first step "
                   "(hipress.casync.rowsparse.probe_plan); none: lossless, the rest plain. The "
                   "hipress-ALGORITHM rows send embeddings as rows where SeCoPa prices them "
                   "cheaper, after one counted step")  # fmt: skip
    e.add_argument("--bucket-cap-mb", default="default", metavar="CAP,..",
                   help="DDP bucket_cap_mb of the hipress rows, each a row of its own: default "
                   "(DDP's), MB, or auto (SeCoPa's recommendation from the measured ready "
                   "times); DDP's rows keep their own (default: default)")  # fmt: skip
    e.add_argument("--out", default=RESULTS, help="directory for the result files")
    e.add_argument("--name", default="e2e", help="basename of the result files")
    e.set_defaults(func=_cmd_e2e)


def _add_convergence_parser(bench_sub: Any) -> None:
    c = bench_sub.add_parser(
        "convergence",
        help="final accuracy of every algorithm (with its error feedback) vs uncompressed",
    )
    c.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
    c.add_argument("--algorithms", default="all", help="comma list, or all shipped algorithms")
    c.add_argument("--epochs", type=int, default=2, help="training epochs (default 2)")
    c.add_argument("--task", choices=("lm", "gpt", "gpt-untied", "tabular"), default="lm",
                   help="lm: word-level LSTM LM on Python's sources; gpt: GPT-2-style "
                   "transformer LM on the same text (tied embeddings; gpt-untied: untied); "
                   "tabular: MLP classifier on a synthetic teacher-student task (default lm)")  # fmt: skip
    c.add_argument("--seeds", type=int, default=1, metavar="N",
                   help="run every configuration with seeds 0..N-1 (weights, batch order, "
                   "CaSync's RNG); report mean and range (default 1)")  # fmt: skip
    c.add_argument("--train-tokens", type=int, default=160_000,
                   help="lm, gpt: tokens per epoch")  # fmt: skip
    c.add_argument("--train-samples", type=int, default=16_384, help="tabular: samples per epoch")
    c.add_argument("--batch", type=int, default=None,
                   help="samples (lm, gpt: windows) per worker per step (default: lm 8, gpt 4, "
                   "tabular 32)")  # fmt: skip
    c.add_argument("--lr", type=float, default=None,
                   help="SGD learning rate (default: lm 0.5, gpt 0.1, tabular 0.05)")  # fmt: skip
    c.add_argument("--lr-schedule", choices=("constant", "cosine"), default="constant",
                   help="constant, or cosine decay to 0 over the run (default constant)")  # fmt: skip
    c.add_argument("--plan", default="default", help="auto (SeCoPa), default, FILE")
    c.add_argument("--include", default="", metavar="PATTERN,..", help="parameters CaSync may "
                   "compress too, e.g. a tied embedding (register(include=...))")  # fmt: skip
    c.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    c.add_argument("--warmup-steps", type=int, default=0,
                   help="CaSync's uncompressed warm-up steps")  # fmt: skip
    c.add_argument("--warmup-epochs", type=float, default=0.0, metavar="E",
                   help="CaSync's uncompressed warm-up in epochs (added to --warmup-steps)")  # fmt: skip
    c.add_argument(
        "--density-warmup-epochs",
        type=int,
        default=0,
        metavar="E",
        help="sparsifiers send 25%%, 6.25%%, ... (4x less each epoch) until their own fraction "
        "for the first E epochs, as DGC's warm-up does",
    )
    c.add_argument("--clip", type=float, default=None,
                   help="gradient norm clipping after the sync (0: none; default 1; dgc: "
                   "after its momentum, at X / (1 - momentum))")  # fmt: skip
    c.add_argument("--fsdp", action="store_true",
                   help="shard with FSDP2 instead of DDP: uncompressed is plain FSDP2, each "
                   "algorithm hipress.fsdp.register (dgc and density warm-ups need DDP); "
                   "writes convergence-fsdp[-TASK].json")  # fmt: skip
    c.add_argument("--fsdp-feedback", default="auto", metavar="OPTION",
                   help="with --fsdp: error feedback auto, none, fp32, bf16 or int8 (default "
                   "auto); an entry ALG:OPTION in --algorithms sets one algorithm's")  # fmt: skip
    c.add_argument("--local-steps", default="", metavar="VARIANT,..",
                   help="also local-step rows, as bench e2e's (hH: each named algorithm); "
                   "each row's time to DDP's final training loss is reported")  # fmt: skip
    c.add_argument("--local-epochs", type=int, default=None, metavar="E",
                   help="local-step rows train E epochs (>= --epochs) to reach DDP's final "
                   "training loss; their loss and accuracy are taken after --epochs")  # fmt: skip
    c.add_argument("--rows", default="", metavar="ALGORITHM,..",
                   help="also row-sparse rows, as bench e2e's: ALGORITHM-rows, the embeddings "
                   "sent as their touched rows from the first step; none: lossless, the rest "
                   "plain; each row's largest loss gap to uncompressed is reported")  # fmt: skip
    c.add_argument("--bandwidth", type=parse_rate_mbit, dest="rate_mbit", default=None,
                   metavar="RATE", help="train on a shaped link of this rate (e.g. 1gbit; "
                   "default: loopback, whose times are not a network's)")  # fmt: skip
    c.add_argument("--out", default=RESULTS, help="directory for the result files")
    c.set_defaults(func=_cmd_convergence)


def _cmd_kernels(args: argparse.Namespace) -> int:
    from hipress.bench.kernels import run
    from hipress.cli.charts import chart_next_to

    status = run(args)
    png = Path(args.out).with_suffix(".png")
    if status == 0 and not args.no_chart and chart_next_to("kernels", args.out, png, sys.stdout):
        print(f"wrote {png}")
    return status


def _cmd_costfit(args: argparse.Namespace) -> int:
    from hipress.bench.costfit import fit_study

    return fit_study(args.out, args.budget, invocation(args))


def _cmd_ring(args: argparse.Namespace) -> int:
    from hipress.bench.ring import ring_study

    return ring_study(args.profiles, args.out, args.latency, invocation(args))


def _cmd_report(args: argparse.Namespace) -> int:
    from hipress.bench.report import update_docs

    stale = update_docs(Path(args.results), Path(args.docs), check=args.check)
    if args.check and stale:
        print(f"{args.docs}: generated tables out of date ({', '.join(stale)}); run "
              "`hipress bench report`", file=sys.stderr)  # fmt: skip
        return 1
    print(f"{args.docs}: " + ("up to date" if not stale else f"regenerated {', '.join(stale)}"))
    return 0


def add_kernels_parser(bench_sub: Any) -> None:
    """Add ``kernels``: encode/decode GB/s of the generated kernels vs torch ops."""
    p = bench_sub.add_parser(
        "kernels",
        help="throughput of the generated kernels (C on CPU, CUDA on a GPU) vs plain torch ops, "
        "with the device's copy roofline",
    )
    p.add_argument("--device", choices=("auto", "cpu", "cuda", "emulated"), default="auto",
                   help="auto: cuda where a GPU is available, else cpu; emulated: the CUDA "
                   "kernels on the CPU emulator (checks the benchmark's CUDA path, not speed)")  # fmt: skip
    p.add_argument("--sizes", default="1K,64K,1M,16M,64M",
                   help="element counts (K/M suffixes), comma separated")  # fmt: skip
    p.add_argument("--algorithms", default="", help="comma separated (default: all shipped)")
    p.add_argument("--reps", type=int, default=5, help="timed repetitions (best is reported)")
    p.add_argument("--no-torch", action="store_true", help="skip the torch-ops baselines")
    p.add_argument("--out", default=f"{RESULTS}/kernels.json", help="JSON results file")
    p.add_argument("--no-chart", action="store_true",
                   help="draw no PNG (default: OUT with .png, the kernels against the roofline)")  # fmt: skip
    p.set_defaults(func=_cmd_kernels)


def _cmd_robustness(args: argparse.Namespace) -> int:
    from hipress.bench.provenance import stamp
    from hipress.bench.robustness import RobustnessOptions, robustness_markdown, run_robustness

    opts = RobustnessOptions(
        workers=args.workers, task=args.task, algorithms=_names(args.algorithms),
        optimizers=_names(args.optimizers), steps=args.steps, threads=args.threads,
    )  # fmt: skip
    results = run_robustness(opts, progress=step_line)
    results["meta"]["command"] = invocation(args)
    stamp(results, invocation(args))
    write_report(results, args.out, f"robustness-{args.task}", robustness_markdown(results))
    return 0 if all(r["verdict"] != "FAIL" for r in results["rows"]) else 1


def add_study_parsers(bench_sub: Any) -> None:
    """Add ``costfit`` and ``ring`` (studies of SeCoPa's cost functions and formulas) and
    ``robustness`` (every algorithm with the user's optimizer, unclipped)."""
    b = bench_sub.add_parser(
        "robustness",
        help="every algorithm, default parameters and plan, with SGD+momentum and AdamW, "
        "unclipped: eval loss against DDP's, or CaSync's refusal",
    )
    b.add_argument("--task", choices=("mlp", "lm"), default="mlp",
                   help="mlp: 64-2048-10 MLP on a synthetic task; lm: the LSTM LM")  # fmt: skip
    b.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    b.add_argument("--algorithms", default="all", help="comma list, or all shipped algorithms")
    b.add_argument("--optimizers", default="sgd,adamw", help="comma list of sgd, adamw")
    b.add_argument("--steps", type=int, default=600, help="optimizer steps (default 600)")
    b.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    b.add_argument("--out", default=RESULTS, help="directory for the result files")
    b.set_defaults(func=_cmd_robustness)
    c = bench_sub.add_parser(
        "costfit",
        help="held-out error of the piecewise-linear and affine-with-floor cost functions",
    )
    c.add_argument("--budget", type=float, default=8.0, metavar="S",
                   help="seconds of timing per algorithm (default 8)")  # fmt: skip
    c.add_argument("--out", default=f"{RESULTS}/costfit.json", help="JSON results file")
    c.set_defaults(func=_cmd_costfit)
    r = bench_sub.add_parser(
        "ring",
        help="is the original's compressed Ring ever predicted faster than PS and allgather?",
    )
    r.add_argument("profiles", nargs="+", metavar="PROFILE", help="hipress profile --out files")
    r.add_argument("--latency", type=parse_latency, default=25e-6,
                   help="per-message latency of every link (default 25us)")  # fmt: skip
    r.add_argument("--out", default=f"{RESULTS}/ring.json", help="JSON results file")
    r.set_defaults(func=_cmd_ring)


def add_report_parser(bench_sub: Any) -> None:
    """Add ``report``: regenerate the benchmark tables of the docs from reference results."""
    p = bench_sub.add_parser(
        "report",
        help="regenerate the tables of docs/reference/benchmarks.md from the reference results",
        description="Each docs/results/<bench>.json is one benchmark's reference result; its "
        "table in the docs lies between generated-table markers and is rewritten here.",
    )
    p.add_argument("--results", default="docs/results", help="folder of <bench>.json files")
    p.add_argument("--docs", default="docs/reference/benchmarks.md", help="markdown file to update")
    p.add_argument("--check", action="store_true", help="change nothing; fail if stale")
    p.set_defaults(func=_cmd_report)
