"""``hipress plan --algorithm powersgd``: SeCoPa's plan of a multi-round algorithm
(:func:`~hipress.secopa.model.rounds_planner.plan_rounds`), each tensor's rounds priced against
its plain all-reduce; the network from ``--bandwidth``/``--latency`` or a saved ``--profile``'s
measured network, the encodes and decode measured now."""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

import torch

from hipress.casync.rounds_plan import resolve
from hipress.cli.args import check_params
from hipress.cli.charts import write_plan_png
from hipress.cli.progress import phase
from hipress.cli.secopa import USER_ERRORS, _link, _link_meta, selection_of
from hipress.codec.errors import CaSyncError
from hipress.compll.rounds import RoundsAlgorithm, load_rounds, rounds_algorithms
from hipress.core.plan import Plan, PlanError
from hipress.secopa.model.profile import Profile, ProfileError, link_network
from hipress.secopa.model.rounds import measure_compute_ms, measure_merge
from hipress.secopa.model.rounds_planner import RoundsProfile, plan_rounds
from hipress.secopa.model.specs import resolve_model

__all__ = ["check_rounds_algorithm", "is_rounds", "rounds_profile", "run_rounds_plan"]

# options of `hipress plan` a multi-round plan does not take
_SINGLE_ROUND = (("readiness", "--readiness"), ("row_density", "--row-density"),
                 ("max_partitions", "--max-partitions"), ("overlap", "--overlap"))  # fmt: skip


def is_rounds(args: argparse.Namespace) -> bool:
    """Whether ``--algorithm`` names a multi-round algorithm."""
    return bool(args.algorithm) and args.algorithm in rounds_algorithms()


def check_rounds_algorithm(flag: str, value: Any, args: argparse.Namespace) -> bool:
    """Whether ``value`` is a multi-round algorithm; if so, raise :class:`UsageError` unless it
    loads with the ``--param`` items (the check of ``plan --algorithm``)."""
    if value not in rounds_algorithms():
        return False
    raw = getattr(args, "param", [])
    check_params(value, raw, load_rounds)
    return True


def rounds_profile(args: argparse.Namespace, alg: RoundsAlgorithm,
                   shapes: list[tuple[int, ...]]) -> RoundsProfile:  # fmt: skip
    """The network (link options, else the ``--profile``'s) and the encodes and decode of
    each of ``shapes`` measured now, within ``--budget`` seconds in all."""
    link = _link(args)
    if link is not None:
        network, call_ms, meta = link_network(*link), 0.0, _link_meta(*link)
    elif args.profile:
        saved = Profile.load(args.profile)
        network, call_ms = dict(saved.network), saved.call_ms
        meta = {"network_source": f"the measured network of {args.profile}"}
    else:
        raise ProfileError("give --bandwidth (to plan for a cluster) or a measured --profile "
                           "(its network is used)")  # fmt: skip
    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    each = args.budget / max(1, len(shapes))
    try:
        with phase(f"timing {alg.name}'s rounds on {len(shapes)} shapes", expect_s=args.budget):
            compute = {s: measure_compute_ms(alg, s, budget_s=each) for s in shapes}
            merge = measure_merge()
    finally:
        torch.set_num_threads(threads)
    meta = {**meta, "compute_budget_s": args.budget}
    return RoundsProfile(network, compute, merge, call_ms, meta)


def run_rounds_plan(args: argparse.Namespace, out: TextIO | None = None,
                    err: TextIO | None = None) -> int:  # fmt: skip
    """``hipress plan`` for a multi-round ``--algorithm``: 0, or 2 on a user error."""
    out, err = out or sys.stdout, err or sys.stderr
    try:
        plan = _plan(args)
        if args.out:
            plan.save(args.out)
    except (*USER_ERRORS, CaSyncError) as exc:
        print(f"error: {exc}", file=err)
        return 2
    if args.json:
        print(plan.to_json(), file=out)
    else:
        print_rounds_plan(plan, args.model, out)
        if args.out:
            print(f"plan saved to {args.out} (digest {plan.digest()})", file=out)
    write_plan_png(args.png, plan, args.model, err if args.json else out)
    out.flush()
    return 0


def _plan(args: argparse.Namespace) -> Plan:
    if args.workers < 1:
        raise PlanError(f"--workers must be >= 1, got {args.workers}")
    for dest, flag in _SINGLE_ROUND:
        if getattr(args, dest, None) is not None:
            raise PlanError(f"{flag} applies to single-round algorithms, not the multi-round "
                            f"{args.algorithm}")  # fmt: skip
    alg = resolve(args.algorithm, dict(args.param), args.backend)
    assert alg is not None
    spec = resolve_model(args.model)
    select = selection_of(args, spec)
    named = [(n, tuple(s)) for n, s in spec.params]
    shapes = sorted({s for n, s in named
                     if len(s) >= 2 and select.reason(n, s, implicit=False) is None})  # fmt: skip
    profile = rounds_profile(args, alg, shapes)
    with phase(f"planning {len(named)} tensors for {args.workers} workers"):
        return plan_rounds(alg, named, args.workers, profile, select)


def print_rounds_plan(plan: Plan, model: str, out: TextIO) -> None:
    """One line per tensor: the decision, each round's predicted ms, the encodes and decode,
    the plain all-reduce and the speedup against it; then the totals."""
    prices: dict[str, Any] = dict(plan.meta.get("rounds_prices") or {})
    kept: dict[str, str] = dict(plan.meta.get("kept_plain") or {})
    rounds = list(plan.meta.get("rounds") or ())
    head = " + ".join(f"{r} ms" for r in rounds)
    print(f"{'parameter':<32} {'decision':<8} {head + ' + codec ms':>28} {'total ms':>10} "
          f"{'plain ms':>10} {'speedup':>8}", file=out)  # fmt: skip
    for e in plan.entries:
        p = prices.get(e.name)
        what = "rounds" if e.compress else "plain"
        if p is None:
            print(f"{e.name:<32} {what:<8} {'':>28} {'':>10} {e.uncompressed_ms:>10.3f} "
                  f"{'':>8}  ({kept.get(e.name, '')})", file=out)  # fmt: skip
            continue
        parts = " + ".join(f"{r:.3f}" for r in p["rounds_ms"]) + f" + {p['compute_ms']:.3f}"
        why = "" if e.compress else f"  ({kept.get(e.name, '')})"
        print(f"{e.name:<32} {what:<8} {parts:>28} {p['total_ms']:>10.3f} {p['plain_ms']:>10.3f} "
              f"{p['speedup']:>7.2f}x{why}", file=out)  # fmt: skip
    t = plan.totals
    n = sum(e.compress for e in plan.entries)
    print(f"\n{model}: {len(plan.entries)} tensors, {n} run {plan.algorithm}'s rounds "
          f"{dict(plan.params)}; N = {plan.world_size}", file=out)  # fmt: skip
    planned, plain = t.get("planned", 0.0), t.get("all_uncompressed", 0.0)
    speed = f" ({plain / planned:.2f}x vs plain)" if planned > 0 else ""
    print(f"predicted sync time per step, each tensor alone: planned {planned:.3f} ms{speed}, "
          f"all plain {plain:.3f} ms", file=out)  # fmt: skip
    for name, price in sorted(dict(plan.meta.get("row_prices") or {}).items()):
        if price["breakeven"] < 0:
            print(f"{name}: exact rows never pay here (dense as above)", file=out)
            continue
        print(f"{name}: exact rows while at most {price['breakeven']} of {price['rows']} rows "
              f"are touched a step (else {plan.meta['embedding_dense'].get(name, 'plain')})",
              file=out)  # fmt: skip
    for name in sorted(plan.meta.get("close_calls") or {}):
        print(f"{name}: a close call between its rounds and plain: kept plain", file=out)
