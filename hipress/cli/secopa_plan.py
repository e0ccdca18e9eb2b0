"""``hipress plan``: plan a model's gradient synchronisation for N workers, print the decisions
and, with the gradients' ready times, the ``bucket_cap_mb`` the job should give DDP."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from hipress.casync.buckets import first_is_cap
from hipress.cli.args import parse_strategies
from hipress.cli.charts import write_plan_png
from hipress.cli.options import add_alias, spelled
from hipress.cli.planreport import print_plan, print_sources, warn_extrapolation
from hipress.cli.progress import phase
from hipress.cli.secopa import (
    MODEL_HELP,
    USER_ERRORS,
    _add_algorithm_args,
    _add_link_args,
    _add_selection_args,
    _origin,
    make_profile,
    selection_of,
)
from hipress.cli.secopa_rounds import is_rounds, run_rounds_plan
from hipress.codec.planning import keep_plain
from hipress.core.plan import PlanError, Strategy
from hipress.secopa.model.bucketcap import CapAdvice, recommend_cap
from hipress.secopa.model.coverage import cost_sources
from hipress.secopa.model.ddpbuckets import BucketCaps, ddp_caps
from hipress.secopa.model.planner import PlannerConfig, plan_named
from hipress.secopa.model.profile import ProfileError, Readiness
from hipress.secopa.model.rowcost import declared_rows
from hipress.secopa.model.specs import resolve_model

__all__ = ["add_plan_parser", "run_plan"]


def add_plan_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``plan``: plan a model for N workers and print the decisions."""
    p = subparsers.add_parser(
        "plan",
        help="plan per tensor whether and how to compress",
        description="Plan a model's gradient synchronisation for N workers. Compute costs come "
        "from --profile or are measured now for --algorithm; the network from --bandwidth/"
        "--latency (any number of workers) or from the profile's measured network. Prints "
        "what each cost rests on and warns where one is priced far beyond what was measured. "
        "The same --profile always gives the same plan; measuring now varies with the load.",
    )
    p.add_argument("--model", required=True, help=MODEL_HELP)
    need = p.add_mutually_exclusive_group(required=True)
    need.add_argument("--workers", type=int, dest="workers", metavar="N",
                      help="number of workers (processes) to plan for")  # fmt: skip
    add_alias(need, "--world-size", "workers", "--workers N", type=int, metavar="N")
    p.add_argument("--profile", default=None, metavar="FILE", help="profile JSON (hipress profile)")
    _add_link_args(p)
    _add_algorithm_args(p)
    p.add_argument("--max-partitions", type=int, default=None, metavar="K",
                   help="largest number of pipelined partitions per tensor (default N)")  # fmt: skip
    p.add_argument(
        "--strategies",
        type=parse_strategies,
        default=(Strategy.ALLGATHER, Strategy.PS),
        help="compressed strategies to consider, comma-separated (default allgather,ps; add "
        "ring to let it choose CaSync's compressed ring)",
    )
    p.add_argument("--bucket-cap-mb", type=float, default=None, metavar="MB",
                   help="DDP's bucket_cap_mb of the training job (default: DDP's default, 25 "
                   "with a 1 MB first bucket)")  # fmt: skip
    p.add_argument("--readiness", default=None, metavar="FILE",
                   help="when each gradient is ready in backward (JSON: a Readiness's to_dict, "
                   "{name: ms before backward ends}, or a hipress bench e2e results file): the "
                   "plan minimises the step's exposed time and recommends a bucket_cap_mb")  # fmt: skip
    _add_selection_args(p)
    p.add_argument("--row-density", type=float, default=None, metavar="FRACTION",
                   help="fraction of each embedding's rows one worker's step touches (measure it "
                   "with hipress.casync.rowsparse.touched_rows): the plan sends an embedding as "
                   "its touched rows where that is predicted faster, and says why")  # fmt: skip
    p.add_argument("--out", default=None, metavar="FILE", help="save the plan as JSON")
    p.add_argument("--json", action="store_true", help="print the plan JSON, not a table")
    p.add_argument("--png", metavar="OUT", help="draw the plan to this PNG (needs matplotlib)")
    p.set_defaults(func=run_plan)
    return p


def run_plan(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Handler of ``hipress plan``: returns 0, or 2 on a user error (message on ``err``)."""
    out, err = out or sys.stdout, err or sys.stderr
    if is_rounds(args):  # (a multi-round algorithm: its own planner)
        return run_rounds_plan(args, out, err)
    try:
        if args.workers < 1:
            flag = spelled(args, "workers", "--workers")
            raise PlanError(f"{flag} must be >= 1, got {args.workers}")
        spec = resolve_model(args.model)
        largest = max((n for _, n in spec.named_numels()), default=1)
        profile = make_profile(args, largest)
        if args.readiness:
            ready = load_readiness(args.readiness, spec.name)
            if not set(ready.leads_ms) & {n for n, _ in spec.named_numels()}:
                raise ProfileError(f"--readiness {args.readiness} names none of {spec.name}'s "
                                   "parameters: were they measured on another model?")  # fmt: skip
            profile = profile.with_readiness(ready)
        caps = ddp_caps(args.bucket_cap_mb, first_is_cap())
        config = PlannerConfig(
            bucket_cap_mb=caps.cap_mb,
            first_bucket_mb=caps.first_mb,
            max_partitions=args.max_partitions,
            strategies=args.strategies,
        )
        select = selection_of(args, spec)
        rows = None if args.row_density is None else (
            declared_rows(spec.params, select, args.row_density))  # fmt: skip
        plain = select.reasons(spec.params)
        with phase(f"planning {len(spec.params)} tensors for {args.workers} workers"):
            plan = plan_named(spec.named_numels(), profile, args.workers, config, rows, plain)
            plan = keep_plain(plan, plain)
        advice = None
        if profile.readiness is not None:
            with phase("judging DDP bucket caps by the exposed step"):
                advice = recommend_cap(
                    spec.named_numels(), profile, args.workers, config, rows, plain=plain,
                    finish=lambda p: keep_plain(p, plain), first_is_cap=first_is_cap(),
                )  # fmt: skip
            plan = replace(plan, meta={**plan.meta, "bucket_cap": advice.to_dict()})
        if args.out:
            plan.save(args.out)
    except USER_ERRORS as exc:
        print(f"error: {exc}", file=err)
        return 2
    if args.json:
        print(plan.to_json(), file=out)
        sources = cost_sources(profile, largest)
    else:
        print_plan(plan, spec.name, profile, out)
        print_bucket_advice(advice, caps, out)
        sources = print_sources(profile, largest, args.workers, _origin(args, profile), out)
        if args.out:
            print(f"plan saved to {args.out} (digest {plan.digest()})", file=out)
    write_plan_png(args.png, plan, spec.name, err if args.json else out)
    out.flush()
    budget = profile.meta.get("compute_budget_s", args.budget)
    warn_extrapolation(profile, sources, largest, budget, err, args.model)
    return 0


def load_readiness(path: str, model: str) -> Readiness:
    """The ready times in ``path`` (see ``--readiness``); a results file of ``hipress bench
    e2e`` gives its compute-only row's of ``model``. Raises :class:`ProfileError`."""
    try:
        d = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ProfileError(f"--readiness {path}: cannot read it: {exc}") from None
    if isinstance(d, dict) and "cells" in d:  # bench e2e results
        leads = [r.get("grad_ready_lead_ms") for c in d["cells"] if c.get("model") == model
                 for r in c.get("rows", []) if r.get("config") == "compute-only"]  # fmt: skip
        if not leads or not leads[0]:
            raise ProfileError(f"--readiness {path}: no compute-only row of {model} with "
                               "grad_ready_lead_ms")  # fmt: skip
        d = {"leads_ms": leads[0]}
    if isinstance(d, dict) and "leads_ms" not in d:
        d = {"leads_ms": d}
    if not isinstance(d, dict):
        raise ProfileError(f"--readiness {path}: expected a JSON object")
    return Readiness.from_dict(d)


def print_bucket_advice(advice: CapAdvice | None, caps: BucketCaps, out: TextIO) -> None:
    """The recommended ``bucket_cap_mb`` and why (nothing to say without ready times)."""
    if advice is None:
        print("bucket_cap_mb: no recommendation without the gradients' ready times "
              "(--readiness FILE)", file=out)  # fmt: skip
        return
    rec = advice.caps
    print(f"recommended DDP bucket cap: {advice.reason}", file=out)
    if advice.tied:
        print(f"  (a close call between {', '.join(advice.tied)}: took {rec.label()})", file=out)
    if rec != caps:
        how = "" if rec.default else f"; build DDP with bucket_cap_mb={rec.cap_mb:g}"
        arg = "no --bucket-cap-mb" if rec.default else f"--bucket-cap-mb {rec.cap_mb:g}"
        print(f"  the plan above is for {caps.label()}: re-plan with {arg}{how}", file=out)
