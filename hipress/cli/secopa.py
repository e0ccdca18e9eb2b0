"""The SeCoPa commands: ``hipress profile``, ``hipress bench plan``, and what ``hipress plan``
(:mod:`hipress.cli.secopa_plan`) shares with them.

Each ``add_*_parser(subparsers)`` adds one sub-command to an argparse sub-parser group and sets
``func`` to its handler; a handler takes the parsed namespace and returns the exit code. The
CLI owns all output (stdout for results, stderr for errors) and reads the environment only here.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import replace
from typing import Any, TextIO

import torch

from hipress.bench.prediction import PLANS, run_bench
from hipress.cli.args import (
    RESULTS,
    parse_bandwidth,
    parse_latency,
    parse_param,
    parse_rate_mbit,
    parse_strategies,
)
from hipress.cli.options import add_alias
from hipress.cli.planreport import print_profile, warn_extrapolation
from hipress.cli.progress import phase
from hipress.cli.waitpolicy import before_timing
from hipress.codec.planning import DEFAULT_ALGORITHM
from hipress.core.plan import PlanError
from hipress.core.rule import SHAPE_WORDS, Selection
from hipress.secopa.measure.localgroup import LocalGroupError, measure_local
from hipress.secopa.measure.profiler import DEFAULT_COMPUTE_SIZES, build_profile, measure_compute
from hipress.secopa.measure.timed_codec import TimedCodecError, load_timed_codec
from hipress.secopa.model.coverage import cost_sources
from hipress.secopa.model.planner import PlannerConfig
from hipress.secopa.model.profile import Profile, ProfileError, link_network
from hipress.secopa.model.specs import ModelSpec, ModelSpecError, builtin_models, resolve_model

log = logging.getLogger(__name__)

USER_ERRORS = (PlanError, ProfileError, ModelSpecError, TimedCodecError, LocalGroupError)
DEFAULT_LATENCY_S = 25e-6


MODEL_HELP = (
    f"a built-in model ({', '.join(builtin_models())}), path/to/file.py:NAME or "
    "package.module:NAME; NAME is an nn.Module class or a factory function returning one, "
    "called without arguments or with the literal ones given: "
    "'train.py:make_model(vocab=8192)' (the file is imported: its __main__ block does not run "
    "and it sees no command-line arguments)"
)


def _add_algorithm_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--algorithm", default=None,
                   help=f"CompLL algorithm (default {DEFAULT_ALGORITHM})")  # fmt: skip
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
        help="seconds to spend timing encode/decode (default 1.5); more measures larger sizes",
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


def _add_selection_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--include", action="append", default=[], metavar="PATTERN",
                   help="parameter name pattern (fnmatch) that may be compressed even if an "
                   "embedding or 1-D, repeatable")  # fmt: skip
    p.add_argument("--exclude", action="append", default=[], metavar="PATTERN",
                   help="parameter name pattern (fnmatch) kept plain, repeatable")  # fmt: skip
    p.add_argument("--shapes", choices=SHAPE_WORDS, default="all",
                   help="all, or matrices: only tensors of exactly two dimensions may be "
                   "compressed (default all; embeddings and 1-D tensors stay plain unless "
                   "--include names them)")  # fmt: skip


def selection_of(args: argparse.Namespace, spec: ModelSpec) -> Selection:
    """The :class:`Selection` of ``--include``/``--exclude``/``--shapes`` for ``spec``'s
    parameters; a bad argument, or a pattern naming no parameter, raises :class:`PlanError`
    in the options' own spelling."""
    try:
        select = Selection(tuple(args.include), tuple(args.exclude), args.shapes, spec.embeddings)
        select.check_names(n for n, _ in spec.params)
        return select
    except ValueError as exc:
        raise PlanError(str(exc).replace("include=", "--include ").replace(
            "exclude=", "--exclude ")) from None  # fmt: skip


def add_profile_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``profile``: measure compute (here) and network (a local gloo group) to JSON."""
    p = subparsers.add_parser(
        "profile",
        help="measure an algorithm's costs and the network into a profile JSON",
        description="Time encode/decode of an algorithm in this process and the collectives "
        "in a local gloo group of --workers processes (or take the network from --bandwidth). "
        "`hipress plan --profile FILE` then plans from these figures, the same plan every time.",
    )
    _add_algorithm_args(p)
    _add_link_args(p)
    p.add_argument("--workers", type=int, default=2, dest="workers", metavar="N",
                   help="processes of the local group that measures the network (default 2)")  # fmt: skip
    add_alias(p, "--nproc", "workers", "--workers N", type=int, metavar="N")
    p.add_argument("--model", default=None, help="time compute up to this model's largest "
                   "tensor, as the budget allows (same forms as plan --model)")  # fmt: skip
    p.add_argument("--out", required=True, metavar="FILE", help="where to write the profile JSON")
    p.set_defaults(func=run_profile)
    return p


def add_bench_plan_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``hipress bench plan``."""
    p.add_argument(
        "--model", default="mlp", help="built-in model name, file.py:NAME or module:NAME"
    )
    p.add_argument("--algorithm", default=DEFAULT_ALGORITHM,
                   help=f"CompLL algorithm (default {DEFAULT_ALGORITHM}, as everywhere)")  # fmt: skip
    p.add_argument("--param", action="append", type=parse_param, default=[], metavar="K=V",
                   help="algorithm hyper-parameter, repeatable")  # fmt: skip
    p.add_argument("--backend", default="auto", help="CompLL backend (auto, cpu, reference)")
    p.add_argument("--workers", type=int, default=2, dest="nproc", metavar="N",
                   help="processes of the local group (default 2)")  # fmt: skip
    add_alias(p, "--nproc", "nproc", "--workers N", type=int, metavar="N")
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    p.add_argument(
        "--bandwidth",
        type=parse_rate_mbit,
        default=None,
        dest="rate_mbit",
        metavar="RATE",
        help="give each worker a NIC shaped to this rate, e.g. 100mbit or 1gbit "
        "(hipress.bench.netsim; needs root); default: unshaped loopback",
    )
    add_alias(p, "--rate-mbit", "rate_mbit", "--bandwidth 100mbit", type=float, metavar="MBIT")
    p.add_argument("--steps", type=int, default=5, help="timed steps per plan")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--budget", type=float, default=1.5, help="compute profiling seconds")
    p.add_argument(
        "--plans",
        default=",".join(PLANS),
        help=f"plans to run, comma-separated (default {','.join(PLANS)})",
    )
    p.add_argument(
        "--strategies",
        type=parse_strategies,
        default=PlannerConfig().strategies,
        help="compressed strategies the planner may choose, comma-separated (default allgather,ps)",
    )
    p.add_argument("--json-out", default=f"{RESULTS}/plan.json", metavar="FILE",
                   help="JSON results file")  # fmt: skip


def add_bench_plan_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``plan`` under ``bench``: measured vs predicted sync time of planned models."""
    p = subparsers.add_parser(
        "plan",
        help="measure real sync time of a plan next to the prediction",
        description="In a local gloo group: profile, plan, then run CaSync with the plan, "
        "all-uncompressed and all-compressed, and print measured against predicted times.",
    )
    add_bench_plan_arguments(p)
    p.set_defaults(func=run_bench)
    return p


def _codec_profile(
    args: argparse.Namespace,
    network: dict[str, Any],
    meta: dict[str, Any],
    largest: int | None = None,
) -> Profile:
    before_timing(f"hipress {args.command}", may_reexec=getattr(args, "own_process", False),
                  err=sys.stderr)  # fmt: skip
    codec = load_timed_codec(args.algorithm or DEFAULT_ALGORITHM, dict(args.param), args.backend)
    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    top = largest if largest and largest > DEFAULT_COMPUTE_SIZES[-1] else None
    label = f"timing {codec.name} encode/decode"
    try:
        with phase(label, expect_s=args.budget):
            compute = measure_compute(codec, budget_s=args.budget, max_size=top)
    finally:
        torch.set_num_threads(threads)
    overlap = 1.0 if args.overlap is None else args.overlap
    meta = {**meta, "compute_budget_s": args.budget}
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


def make_profile(args: argparse.Namespace, largest: int | None = None) -> Profile:
    """The profile ``plan`` uses (see the ``plan`` help); raises a user error if underdefined
    or contradictory. Compute measured now reaches up to ``largest`` elements where the
    budget allows."""
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
    return _codec_profile(args, link_network(*link), _link_meta(*link), largest)


def _origin(args: argparse.Namespace, profile: Profile) -> str:
    if args.profile:
        host = profile.meta.get("host")
        return f"compute figures from {args.profile}" + (f" (host {host})" if host else "")
    return (
        f"compute figures measured now (--budget {args.budget:g} s): they vary with this "
        "machine's load; for the same plan every time, save a profile (hipress profile "
        "--out p.json) and plan with --profile p.json"
    )


def run_profile(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Handler of ``hipress profile``: returns 0, or 2 on a user error."""
    out, err = out or sys.stdout, err or sys.stderr
    try:
        largest = None
        if args.model:
            largest = max((n for _, n in resolve_model(args.model).named_numels()), default=1)
        link = _link(args)
        if link is not None:
            net, meta = link_network(*link), _link_meta(*link)
        else:
            with phase(f"measuring the network in a local group of {args.workers} processes"):
                samples, meta = measure_local(args.workers, threads=args.threads or 1)
            net = dict(samples.ops)
        profile = _codec_profile(args, net, meta, largest)
        profile.save(args.out)
    except USER_ERRORS as exc:
        print(f"error: {exc}", file=err)
        return 2
    print_profile(profile, out)
    print(f"profile saved to {args.out}", file=out)
    if largest is not None:
        sources = cost_sources(profile, largest)
        warn_extrapolation(profile, sources, largest, args.budget, err, args.model)
    return 0


def add_parsers(subparsers: Any) -> None:
    """Add ``profile`` to the top-level group (``plan``: :mod:`hipress.cli.secopa_plan`)."""
    add_profile_parser(subparsers)
