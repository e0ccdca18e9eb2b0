"""Command-line front ends of SeCoPa: ``hipress plan``, ``hipress profile``, ``hipress bench plan``.

:func:`add_parsers` is the hook :mod:`hipress.cli` calls. Each ``add_*_parser(subparsers)`` adds
one sub-command to an argparse sub-parser group and sets ``func`` to its handler; a handler
takes the parsed namespace and returns the exit code. The
CLI owns all output (stdout for results, stderr for errors) and reads the environment only here.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, TextIO

import torch

from hipress.secopa.codec import CodecError, load_codec
from hipress.secopa.localgroup import LocalGroupError, measure_local
from hipress.secopa.models import ModelSpecError, builtin_models, resolve_model
from hipress.secopa.plan import Plan, PlanError, Strategy
from hipress.secopa.planner import PlannerConfig, plan_named
from hipress.secopa.profile import Profile, ProfileError, link_network
from hipress.secopa.profiler import build_profile, measure_compute

log = logging.getLogger(__name__)

USER_ERRORS = (PlanError, ProfileError, ModelSpecError, CodecError, LocalGroupError)
DEFAULT_LATENCY_S = 25e-6

_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_RATE = re.compile(
    r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMgGtT]?)(bit|b|B)(/s|ps)?\s*$"
)
_TIME = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(ns|us|µs|ms|s)\s*$")
_TIME_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}


def parse_bandwidth(text: str) -> float:
    """``10gbit``, ``10Gbps``, ``100mbit/s``, ``1.25GB/s`` -> bytes per second.

    ``bit``/lower-case ``b`` are bits, upper-case ``B`` bytes; prefixes are decimal (k, M, G, T).
    Raises ``argparse.ArgumentTypeError`` with examples on anything else.
    """
    m = _RATE.match(text)
    if not m or float(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError(
            f"bad bandwidth {text!r}: use e.g. 10gbit, 25Gbps, 100mbit/s or 1.25GB/s"
        )
    value = float(m.group(1)) * _PREFIX[m.group(2).lower()]
    return value if m.group(3) == "B" else value / 8.0


def parse_latency(text: str) -> float:
    """``25us``, ``0.1ms``, ``2e-5s`` -> seconds."""
    m = _TIME.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"bad latency {text!r}: use e.g. 25us, 0.1ms or 2e-5s")
    return float(m.group(1)) * _TIME_UNIT[m.group(2)]


def parse_param(text: str) -> tuple[str, Any]:
    """``key=value`` with value parsed as int, float, true/false, or left a string."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"bad parameter {text!r}: use key=value")
    value: Any = raw
    if raw.lower() in ("true", "false"):
        value = raw.lower() == "true"
    else:
        for conv in (int, float):
            try:
                value = conv(raw)
                break
            except ValueError:
                pass
    return key, value


def parse_strategies(text: str) -> tuple[Strategy, ...]:
    try:
        out = tuple(Strategy(s.strip()) for s in text.split(",") if s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"bad strategies {text!r}: use allgather, ps, ring"
        ) from None
    if not out or Strategy.ALLREDUCE in out:
        raise argparse.ArgumentTypeError("give compressed strategies: allgather, ps, ring")
    return out


def _add_algorithm_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--algorithm", default=None, help="CompLL algorithm (default terngrad)")
    p.add_argument(
        "--param",
        action="append",
        type=parse_param,
        default=[],
        metavar="K=V",
        help="algorithm hyper-parameter, repeatable (e.g. --param bitwidth=2)",
    )
    p.add_argument("--backend", default="auto", help="CompLL backend (auto, cpu, reference)")
    p.add_argument(
        "--budget",
        type=float,
        default=1.5,
        metavar="S",
        help="seconds to spend timing encode/decode (default 1.5)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads while timing compute (default: torch's)",
    )


def _add_link_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--bandwidth",
        type=parse_bandwidth,
        default=None,
        help="link bandwidth of the target cluster, e.g. 10gbit or 1.25GB/s",
    )
    p.add_argument(
        "--latency",
        type=parse_latency,
        default=None,
        help="per-message latency with --bandwidth (default 25us)",
    )
    p.add_argument(
        "--overlap",
        type=float,
        default=None,
        help="fraction of compute hidden by pipelining, 0..1 (default: profile's)",
    )


def add_plan_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``plan``: plan a model for N workers and print the decisions."""
    p = subparsers.add_parser(
        "plan",
        help="plan per tensor whether and how to compress",
        description="Plan a model's gradient synchronisation for N workers. Compute costs come "
        "from --profile or are measured now for --algorithm; the network from --bandwidth/"
        "--latency (any world size) or from the profile's measured network.",
    )
    p.add_argument(
        "--model", required=True, help=f"one of {', '.join(builtin_models())}, or module:attr"
    )
    p.add_argument("--world-size", type=int, required=True, metavar="N")
    p.add_argument("--profile", default=None, metavar="FILE", help="profile JSON (hipress profile)")
    _add_link_args(p)
    _add_algorithm_args(p)
    p.add_argument("--max-partitions", type=int, default=None, metavar="K")
    p.add_argument(
        "--strategies",
        type=parse_strategies,
        default=(Strategy.ALLGATHER, Strategy.PS),
        help="compressed strategies to consider (default allgather,ps; add ring to let it "
        "choose CaSync's compressed ring)",
    )
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--out", default=None, metavar="FILE", help="save the plan as JSON")
    p.add_argument("--json", action="store_true", help="print the plan JSON, not a table")
    p.set_defaults(func=run_plan)
    return p


def add_profile_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``profile``: measure compute (here) and network (a local gloo group) to JSON."""
    p = subparsers.add_parser(
        "profile",
        help="measure an algorithm's costs and the network into a profile JSON",
        description="Time encode/decode of an algorithm in this process and the collectives "
        "in a local gloo group of --nproc processes (or take the network from --bandwidth).",
    )
    _add_algorithm_args(p)
    _add_link_args(p)
    p.add_argument("--nproc", type=int, default=2, help="processes of the local group")
    p.add_argument("--out", required=True, metavar="FILE")
    p.set_defaults(func=run_profile)
    return p


def add_bench_plan_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``plan`` under ``bench``: measured vs predicted sync time of planned models."""
    from hipress.secopa.validate import add_arguments, run_bench

    p = subparsers.add_parser(
        "plan",
        help="measure real sync time of a plan next to the prediction",
        description="In a local gloo group: profile, plan, then run CaSync with the plan, "
        "all-uncompressed and all-compressed, and print measured against predicted times.",
    )
    add_arguments(p)
    p.set_defaults(func=run_bench)
    return p


def _codec_profile(
    args: argparse.Namespace, network: dict[str, Any], meta: dict[str, Any]
) -> Profile:
    codec = load_codec(args.algorithm or "terngrad", dict(args.param), args.backend)
    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        compute = measure_compute(codec, budget_s=args.budget)
    finally:
        torch.set_num_threads(threads)
    overlap = 1.0 if args.overlap is None else args.overlap
    return build_profile(codec, compute, network, overlap=overlap, meta=meta)


def _link(args: argparse.Namespace) -> tuple[float, float] | None:
    """(bandwidth B/s, latency s) from the options, or None without --bandwidth."""
    if args.bandwidth is None:
        if args.latency is not None:
            raise ProfileError("--latency needs --bandwidth")
        return None
    return args.bandwidth, DEFAULT_LATENCY_S if args.latency is None else args.latency


def _link_meta(bandwidth: float, latency: float) -> dict[str, Any]:
    return {
        "network_source": {
            "kind": "link",
            "bandwidth_bytes_per_s": bandwidth,
            "latency_s": latency,
        }
    }


def make_profile(args: argparse.Namespace) -> Profile:
    """The profile ``plan`` uses (see the ``plan`` help); raises a user error if underdefined
    or contradictory."""
    link = _link(args)
    if args.profile:
        profile = Profile.load(args.profile)
        if args.algorithm and args.algorithm != profile.algorithm:
            raise ProfileError(
                f"--algorithm {args.algorithm} but the profile is for {profile.algorithm}"
            )
        differ = {k: v for k, v in args.param if profile.params.get(k) != v}
        if differ:
            raise ProfileError(
                f"--param {differ} but the profile was measured with {dict(profile.params)}"
            )
        if link is not None:
            profile = profile.with_link(*link)
        if args.overlap is not None:
            profile = replace(profile, overlap=args.overlap)
        return profile
    if link is None:
        raise ProfileError("give --bandwidth (to plan for a cluster) or a measured --profile")
    return _codec_profile(args, link_network(*link), _link_meta(*link))


def run_plan(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Handler of ``hipress plan``: returns 0, or 2 on a user error (message on ``err``)."""
    out, err = out or sys.stdout, err or sys.stderr
    try:
        if args.world_size < 1:
            raise PlanError(f"--world-size must be >= 1, got {args.world_size}")
        spec = resolve_model(args.model)
        profile = make_profile(args)
        config = PlannerConfig(
            bucket_cap_mb=args.bucket_cap_mb,
            max_partitions=args.max_partitions,
            strategies=args.strategies,
        )
        plan = plan_named(spec.named_numels(), profile, args.world_size, config)
        if args.out:
            plan.save(args.out)
    except USER_ERRORS as exc:
        print(f"error: {exc}", file=err)
        return 2
    if args.json:
        print(plan.to_json(), file=out)
    else:
        print_plan(plan, spec.name, profile, out)
        if args.out:
            print(f"plan saved to {args.out} (digest {plan.digest()})", file=out)
    return 0


def run_profile(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Handler of ``hipress profile``: returns 0, or 2 on a user error."""
    out, err = out or sys.stdout, err or sys.stderr
    try:
        link = _link(args)
        if link is not None:
            net, meta = link_network(*link), _link_meta(*link)
        else:
            samples, meta = measure_local(args.nproc, threads=args.threads or 1)
            net = dict(samples.ops)
        profile = _codec_profile(args, net, meta)
        profile.save(args.out)
    except USER_ERRORS as exc:
        print(f"error: {exc}", file=err)
        return 2
    print_profile(profile, out)
    print(f"profile saved to {args.out}", file=out)
    return 0


def _fmt_ms(ms: float) -> str:
    return f"{ms:.3f}" if ms < 100 else f"{ms:.1f}"


def print_plan(plan: Plan, model: str, profile: Profile, out: TextIO) -> None:
    """The plan as a table, then its totals."""
    rows = [("parameter", "elements", "decision", "strategy", "K", "pred ms", "plain ms")]
    for e in plan.entries:
        rows.append(
            (
                e.name,
                f"{e.numel:,}",
                "compress" if e.compress else "plain",
                e.strategy.value,
                str(e.partitions),
                _fmt_ms(e.predicted_ms),
                _fmt_ms(e.uncompressed_ms),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        cells = [
            c.ljust(w) if i in (0, 2, 3) else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        print("  ".join(cells).rstrip(), file=out)
    t = plan.totals
    comp = [e for e in plan.entries if e.compress]
    share = sum(e.numel for e in comp) / max(1, sum(e.numel for e in plan.entries))
    print(file=out)
    print(
        f"{model}: {len(plan.entries)} tensors, {len(comp)} compressed ({share:.1%} of "
        f"elements); {plan.algorithm} {dict(plan.params)}; N = {plan.world_size}",
        file=out,
    )
    print(f"network: {_network_summary(profile)}", file=out)
    print("predicted sync time per step (ms):", file=out)
    base = t.get("all_uncompressed", 0.0)
    for key in ("planned", "all_uncompressed", "all_compressed"):
        if key in t:
            speed = f"  ({base / t[key]:.2f}x vs uncompressed)" if t[key] > 0 and base else ""
            print(f"  {key:<17} {_fmt_ms(t[key]):>10}{speed}", file=out)


def _network_summary(profile: Profile) -> str:
    src = dict(profile.meta.get("network_source", {}))
    if src.get("kind") == "link":
        gbit = src["bandwidth_bytes_per_s"] * 8 / 1e9
        return f"link {gbit:g} Gbit/s, {src['latency_s'] * 1e6:g} us latency"
    if src.get("kind") == "measured":
        return f"measured ({src.get('backend')}, {src.get('world_size')} processes), extrapolated"
    return "from profile"


def print_profile(profile: Profile, out: TextIO) -> None:
    """A short human summary of a profile."""
    from hipress.secopa.profiler import bandwidth_summary

    print(
        f"{profile.algorithm} {dict(profile.params)}: payload "
        f"{profile.payload.bytes_per_element:g} B/element + {profile.payload.header:g} B",
        file=out,
    )
    for op in sorted(profile.compute):
        ms = profile.compute_ms(op, [1 << 10, 1 << 20])
        print(f"  {op:<10} 1K: {ms[0] * 1e3:8.1f} us   1M: {ms[1]:8.3f} ms", file=out)
    for op in ("allreduce", "all_gather", "all_to_all", "broadcast"):
        print(f"  {op:<10} {bandwidth_summary(profile.network[op])}", file=out)
    print(f"  overlap    {profile.overlap:.2f}", file=out)


def register(subparsers: Any) -> None:
    """Add ``plan`` and ``profile`` to a top-level sub-parser group."""
    add_plan_parser(subparsers)
    add_profile_parser(subparsers)


def add_parsers(subparsers: Any, bench_subparsers: Any | None = None) -> None:
    """The extension hook of :mod:`hipress.cli`: ``plan`` and ``profile`` at the top level,
    ``plan`` under ``bench``."""
    register(subparsers)
    if bench_subparsers is not None:
        add_bench_plan_parser(bench_subparsers)


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry (``python -m hipress.secopa.cli plan ...``) until the lead wires it."""
    parser = argparse.ArgumentParser(prog="hipress")
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench", required=True)
    add_parsers(sub, bench)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
