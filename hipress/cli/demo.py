"""``hipress demo``: train a language model (a word-level LSTM, or with ``--model gpt`` a
GPT-2-style transformer) on local workers, uncompressed and with hipress, then print a
comparison, write ``demo.json`` and (with matplotlib) ``demo.png``.

The CLI owns all output: the settings, rank 0's progress bars (on stderr), the summary table and
the chart. See docs/reference/demo.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from hipress.cli.args import RESULTS, parse_rate_mbit
from hipress.cli.charts import chart_next_to
from hipress.cli.demo_chart import write_chart
from hipress.cli.options import add_alias
from hipress.demo.config import DemoConfig, DemoError, DemoResult, RunResult, default_runs
from hipress.demo.models import MODELS, defaults, model_config
from hipress.demo.wordlm import ModelConfig

__all__ = ["add_parser", "cmd_demo", "format_summary", "write_chart"]

DEFAULT_ALGORITHM = "topk"
DEFAULT_STEPS = 300


def _predicted_vs_measured(run: RunResult, speed: float, base: str) -> list[str]:
    """The plan's predicted speed-up of the sync next to the measured one of the whole step,
    and a warning where compression lost."""
    out = []
    if run.predicted_speedup:
        out.append(f"{run.spec.name}: the plan predicted its sync {run.predicted_speedup:.2f}x "
                   f"faster than uncompressed; measured, the whole step ran at {speed:.2f}x "
                   f"{base}'s throughput")  # fmt: skip
    if run.fell_back:
        out.append(f"{run.spec.name}: CaSync measured compression losing a few steps in and "
                   "fell back to the plain plan (all-reduce) on every worker")  # fmt: skip
    elif 0 < speed < 1:
        out.append(f"warning: {run.spec.name} ran slower than {base} here: compression costs "
                   "more than it saves on this network (on loopback, bytes are nearly free); "
                   "plan for the real network (hipress plan --bandwidth) or train plain")  # fmt: skip
    return out


def _mib(nbytes: float) -> str:
    if nbytes >= 2**30:
        return f"{nbytes / 2**30:.2f} GiB"
    if nbytes >= 2**20:
        return f"{nbytes / 2**20:.2f} MiB"
    return f"{nbytes / 2**10:.1f} KiB"


def format_summary(result: DemoResult) -> str:
    """The summary table and a one-line comparison of the last run against the first."""
    head = (
        "run",
        "samples/s",
        "sent/step/worker",
        "sent total",
        "val loss",
        "val ppl",
        "val acc %",
        "wall s",
    )
    rows = [
        (
            r.spec.name,
            f"{r.samples_per_s:.1f}",
            _mib(r.bytes_per_step),
            _mib(r.bytes_total),
            f"{r.final.loss:.3f}",
            f"{r.final.perplexity:.1f}",
            f"{100 * r.final.accuracy:.1f}",
            f"{r.wall_s:.1f}",
        )
        for r in result.runs
    ]
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]

    def line(cells: tuple[str, ...]) -> str:
        first = cells[0].ljust(widths[0])
        return "  ".join([first, *(c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))])

    out = [line(head), "  ".join("-" * w for w in widths), *(line(r) for r in rows)]
    base, last = result.runs[0], result.runs[-1]
    if len(result.runs) > 1 and base.bytes_per_step > 0:
        speed = last.samples_per_s / base.samples_per_s if base.samples_per_s else 0.0
        out.append("")
        out.append(
            f"{last.spec.name} sent {100 * last.bytes_per_step / base.bytes_per_step:.1f}% of "
            f"the bytes of {base.spec.name} ({base.bytes_per_step / last.bytes_per_step:.1f}x "
            f"less), reached {100 * last.final.accuracy:.1f}% vs "
            f"{100 * base.final.accuracy:.1f}% validation accuracy, at {speed:.2f}x its "
            "throughput"
        )
        out.extend(_predicted_vs_measured(last, speed, base.spec.name))
    if any(r.breakdown for r in result.runs):
        cols = ("step", "compute", "encode", "decode", "wait", "python", "other")
        out.append("")
        out.append("where a traced step's time went (ms, mean over the workers):")
        width = max(len(r.spec.name) for r in result.runs)
        out.append(f"  {'run':<{width}}  " + "  ".join(f"{c + ' ms':>10}" for c in cols))
        for r in result.runs:
            if r.breakdown:
                got = [r.breakdown.get(c, 0.0) for c in cols]
                vals = "  ".join(f"{'n/a':>10}" if v is None else f"{v:10.1f}" for v in got)
                out.append(f"  {r.spec.name:<{width}}  {vals}")
        out.append(f"  timelines: hipress trace {Path(result.runs[-1].traces[0]).parent}/*.json")
    for r in result.runs:
        if r.spec.algorithm is None:
            continue
        sync = r.sync
        out.append(
            f"{r.spec.name}: plan {r.plan}; per step encode {sync.get('encode_ms', 0):.1f} ms, "
            f"decode {sync.get('decode_ms', 0):.1f} ms, sync {sync.get('sync_ms', 0):.1f} ms"
        )
        if r.compressed_tensors == 0:
            slower = (
                "--bandwidth 100mbit (a slower simulated NIC)"
                if result.network.startswith(tuple("0123456789"))
                else "--bandwidth 1gbit (a simulated 1 Gbit/s NIC per worker, needs root)"
            )
            out.append(
                f"  SeCoPa compressed nothing: on this network ({result.network}) and with this "
                "CPU's current load, compressing was measured to cost more time than it saves. "
                f"Try {slower} or --plan default (always compress large tensors)."
            )
    return "\n".join(out)


def _config(args: argparse.Namespace) -> DemoConfig:
    d = defaults(args.model)
    seq_len = d["seq_len"] if args.seq_len is None else args.seq_len
    try:
        model = model_config(
            args.model, args.vocab, seq_len, args.emb_dim, args.layers, args.hidden
        )
    except ValueError as exc:
        raise DemoError(str(exc)) from None
    return DemoConfig(
        workers=args.workers,
        steps=args.steps,
        batch=d["batch"] if args.batch is None else args.batch,
        seq_len=seq_len,
        model=model,
        lr=args.lr,
        seed=args.seed,
        threads=args.threads,
        timeout=args.timeout,
        progress=not args.quiet,
        trace_dir=None if args.no_trace else str(Path(args.out) / "demo-traces"),
    )


def _check_algorithm(name: str, params: dict[str, Any]) -> None:
    from hipress.compll import CllError, load

    try:
        load(name, backend="reference", **params)
    except (CllError, KeyError, TypeError, ValueError) as exc:
        raise DemoError(f"--algorithm {name}: {exc}") from None


DEFAULT_NET_MBIT = 1000.0  # the NIC the demo simulates when it can (root + iproute2)


def _run(config: DemoConfig, runs: Any, corpus: Any, net_mbit: float | None) -> DemoResult:
    from hipress.demo.train import run_demo

    if net_mbit is None:  # auto: a simulated 1 Gbit/s cluster where possible, else loopback
        from hipress.bench.netsim import shaping_unavailable_reason

        reason = shaping_unavailable_reason()
        if reason is not None:
            print(
                f"network: loopback (cannot simulate a {DEFAULT_NET_MBIT:.0f} Mbit/s NIC per "
                f"worker: {reason})",
                flush=True,
            )
            return run_demo(config, runs, corpus)
        net_mbit = DEFAULT_NET_MBIT
    if net_mbit <= 0:
        print("network: loopback (127.0.0.1)", flush=True)
        return run_demo(config, runs, corpus)
    from hipress.bench.netsim import LoopbackNetwork, NetSimError, open_network

    try:
        with open_network(config.workers, net_mbit) as net:
            if isinstance(net, LoopbackNetwork):
                print(f"network: cannot shape ({net.reason}); running on loopback", flush=True)
                return run_demo(config, runs, corpus)
            print(f"network: {net.label} (simulated, network namespaces)", flush=True)
            return run_demo(config, runs, corpus, net=net)
    except NetSimError as exc:
        raise DemoError(f"--bandwidth: {exc}") from None


def cmd_demo(args: argparse.Namespace) -> int:
    """Run the demo as ``args`` say; prints everything; returns the exit status."""
    from hipress.bench.provenance import stamp
    from hipress.cli.args import parse_params
    from hipress.demo.data import DataError, load_corpus

    t0 = time.perf_counter()
    try:
        params = parse_params(args.param)
        _check_algorithm(args.algorithm, params)
        plan = None if args.plan == "default" else args.plan
        if plan not in (None, "auto") and not Path(plan).is_file():
            raise DemoError(f"--plan {plan}: no such file (use auto, default or a plan file)")
        config = _config(args)
        corpus = load_corpus(config.model.vocab_size)
        runs = default_runs(args.algorithm, params, plan)
        from hipress.demo.models import build_model, describe_model

        model = build_model(config.model)
        nparams = sum(p.numel() for p in model.parameters())
        print(
            f"hipress demo: {config.workers} worker processes (gloo, "
            f"{config.worker_threads()} torch thread(s) each), {config.steps} steps per run\n"
            f"data:  {corpus.describe()}\n"
            f"model: {describe_model(config.model, nparams)}; {_mib(4 * nparams)} of gradient "
            "per step\n"
            f"batch: {config.batch} x {config.seq_len} tokens per worker per step, Adam "
            f"lr {config.lr:g}\n"
            f"runs:  uncompressed (DDP allreduce), then hipress {args.algorithm} "
            f"(CaSync, plan {args.plan})",
            flush=True,
        )
        result = _run(config, runs, corpus, args.net_mbit)
    except (DemoError, DataError) as exc:
        print(f"hipress demo: {exc}", file=sys.stderr)
        return 1
    print()
    print(format_summary(result))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = stamp(result.as_dict(), getattr(args, "invocation", "hipress demo"))
    chart = out / "demo.png"
    drew = not args.no_chart and write_chart(result, chart)
    data["chart"] = str(chart) if drew else None
    (out / "demo.json").write_text(json.dumps(data, indent=1) + "\n")
    wrote = [str(out / "demo.json")] + ([str(chart)] if drew else [])
    versus = out / "demo-prediction.png"  # predicted against measured speed-up
    if drew and chart_next_to("prediction", out / "demo.json", versus, sys.stdout):
        wrote.append(str(versus))
    print(f"\nwrote {', '.join(wrote)}")
    if not drew and not args.no_chart:
        print("chart skipped: matplotlib is not installed (pip install 'hipress[demo]')")
    print(f"total wall time {time.perf_counter() - t0:.1f} s")
    return 0


def _rate(text: str) -> float:
    """``--bandwidth``: Mbit/s of the simulated NIC, 0 for ``loopback``."""
    mbit = parse_rate_mbit(text)
    return 0.0 if mbit is None else mbit


def add_parser(sub: Any) -> None:
    """Add ``demo`` to the top-level group ``sub``."""
    d = sub.add_parser(
        "demo",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="train a language model on local workers, uncompressed and with hipress; compare",
        description=(
            "Start N local worker processes (gloo) and train a language model (a word-level "
            "LSTM, or a GPT-2-style transformer with --model gpt) on the Python standard "
            "library's source, once with plain DDP allreduce and once "
            "with hipress (CaSync hook, SeCoPa plan). Prints throughput, bytes sent and "
            "validation loss/accuracy, and writes demo.json, demo.png and demo-prediction.png "
            "(predicted against measured speed-up)."
        ),
    )
    d.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    d.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="steps per run")
    d.add_argument("--algorithm", default=DEFAULT_ALGORITHM, help="CompLL algorithm")
    d.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="an algorithm parameter, repeatable (e.g. --param ratio=0.01)")  # fmt: skip
    d.add_argument(
        "--plan",
        default="auto",
        help="auto (SeCoPa measures and plans), default (CaSync's rule) or a plan file",
    )
    d.add_argument(
        "--bandwidth",
        type=_rate,
        default=None,
        dest="net_mbit",
        metavar="RATE",
        help="give each worker a simulated NIC of this rate, e.g. 100mbit or 1gbit (network "
        "namespaces + tc; needs root and iproute2); loopback: plain loopback. Default: "
        f"{DEFAULT_NET_MBIT / 1000:g}gbit where the simulation can run, else loopback",
    )
    add_alias(d, "--net-mbit", "net_mbit", "--bandwidth 1gbit (or loopback)", type=float)
    d.add_argument("--out", default=RESULTS, help="directory for demo.json/demo.png")
    d.add_argument("--model", choices=MODELS, default="lstm",
                   help="lstm: word-level LSTM LM; gpt: GPT-2-style transformer LM with tied "
                   "input/output embeddings (a dense embedding gradient); gpt-untied: the same "
                   "untied (a row-sparse input-embedding gradient)")  # fmt: skip
    d.add_argument("--batch", type=int, default=None,
                   help="sequences per worker per step (default: lstm 16, gpt 4)")  # fmt: skip
    d.add_argument("--seq-len", type=int, default=None,
                   help="tokens per sequence; a GPT's context (default: lstm 32, gpt 128)")  # fmt: skip
    d.add_argument("--vocab", type=int, default=ModelConfig.vocab_size, help="vocabulary size")
    d.add_argument("--emb-dim", type=int, default=None,
                   help="embedding width; a GPT's model width (default: lstm 384, gpt 128)")  # fmt: skip
    d.add_argument("--hidden", type=int, default=None,
                   help="LSTM hidden size (lstm only; default 128)")  # fmt: skip
    d.add_argument("--layers", type=int, default=None,
                   help="LSTM layers or transformer blocks (default: lstm 1, gpt 4)")  # fmt: skip
    d.add_argument("--lr", type=float, default=DemoConfig.lr, help="Adam learning rate")
    d.add_argument("--seed", type=int, default=0, help="random seed of data and weights")
    d.add_argument("--threads", type=int, default=0, help="torch threads per worker (0: auto)")
    d.add_argument("--timeout", type=float, default=900.0, help="stop the job after this many s")
    d.add_argument("--no-chart", action="store_true",
                   help="draw no PNG (demo.png, demo-prediction.png)")  # fmt: skip
    d.add_argument("--no-trace", action="store_true",
                   help="keep no step timelines (default: 10 timed steps of each run in "
                   "OUT/demo-traces/, read with hipress trace)")  # fmt: skip
    d.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    d.set_defaults(func=cmd_demo)
