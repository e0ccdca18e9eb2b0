"""What ``hipress plan`` and ``hipress profile`` print: the plan table and totals, what its
costs rest on (:mod:`hipress.secopa.model.coverage`) with a warning where a cost is priced far beyond
what was measured, and a profile's summary."""

from __future__ import annotations

from typing import Any, TextIO

from hipress.core.plan import Plan
from hipress.secopa.model.coverage import CostSource, cost_sources, far_extrapolations
from hipress.secopa.model.profile import Profile

__all__ = ["print_plan", "print_profile", "print_row_prices", "print_sources", "warn_extrapolation"]


def _fmt_ms(ms: float) -> str:
    return f"{ms:.3f}" if ms < 100 else f"{ms:.1f}"


def print_plan(plan: Plan, model: str, profile: Profile, out: TextIO) -> None:
    """The plan as a table, then its totals."""
    print(plan.table(heading=False), file=out)
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
    if "exposed" in t:
        print("  (the three above: every bucket's sync in full, none hidden behind backward)",
              file=out)  # fmt: skip
        print(f"  {'exposed':<17} {_fmt_ms(t['exposed']):>10}  (what the step waits for after "
              "backward, as the plan was chosen by)", file=out)  # fmt: skip
    print_kept_plain(plan, out)
    print_row_prices(plan, out)


def print_row_prices(plan: Plan, out: TextIO) -> None:
    """Each tensor SeCoPa priced as rows (``meta["row_prices"]``): the rows touched a step,
    the rows' and the dense time, the break-even count and what the plan chose."""
    prices: dict[str, dict[str, Any]] = dict(plan.meta.get("row_prices", {}))
    if not prices:
        return
    print("row-sparse (only the rows a step touches travel, as indices and rows):", file=out)
    for name, p in prices.items():
        be, rows = p["breakeven"], p["rows"]
        limit = f"rows pay up to {be} of {rows} rows a step" if be >= 0 else "rows never pay"
        if "touched" not in p:
            print(f"  {name}: {limit} (no row count given)", file=out)
            continue
        print(f"  {name}: {p['touched']} of {rows} rows a step: rows {_fmt_ms(p['ms'])} ms "
              f"({p['bytes'] / 1e6:.2f} MB) vs dense {_fmt_ms(p['dense_ms'])} ms: "
              f"{p['chosen']} ({limit})", file=out)  # fmt: skip


def print_kept_plain(plan: Plan, out: TextIO) -> None:
    """What the plan kept plain before any cost was weighed (``meta["kept_plain"]``), by
    reason: embeddings, 1-D tensors, ``--exclude`` patterns, the ``--shapes`` rule."""
    kept: dict[str, str] = dict(plan.meta.get("kept_plain", {}))
    if not kept:
        return
    by_reason: dict[str, list[str]] = {}
    for name, why in kept.items():
        by_reason.setdefault(why, []).append(name)
    print(f"kept plain whatever the cost ({len(kept)} tensors; --include PATTERN compresses "
          "embeddings and 1-D tensors it names):", file=out)  # fmt: skip
    for why, names in by_reason.items():
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        print(f"  {why}: {shown}", file=out)


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
    from hipress.secopa.measure.netprofiler import bandwidth_summary

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


def _size(value: float, unit: str) -> str:
    if unit == "bytes":
        for scale, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
            if value >= scale:
                return f"{value / scale:g} {name}"
        return f"{value:g} B"
    return f"{value:,.0f}"


def _describe(s: CostSource, world: int) -> str:
    if s.kind == "link":
        return "given link (alpha-beta model, any size)"
    if s.kind == "fit" or s.lo is None or s.hi is None:
        return "fitted constants (no measured size range)"
    where = f"measured over {_size(s.lo, s.unit)} .. {_size(s.hi, s.unit)} {s.unit}"
    if s.unit == "bytes":
        where = where.replace(" bytes", " per rank") + f" at N={s.measured_world}"
        if s.measured_world != world:
            where += f"; N={world} from its alpha-beta fit"
    if s.factor > 1.0:
        where += f"; largest use {_size(s.needed, s.unit)}: extrapolated {s.factor:,.0f}x"
    return where


def print_sources(
    profile: Profile, largest: int, world: int, origin: str, out: TextIO
) -> list[CostSource]:
    """Print where each cost of the plan comes from, then ``origin`` (where the compute
    figures were measured); return the sources."""
    sources = cost_sources(profile, largest)
    print(f"costs (largest tensor {largest:,} elements):", file=out)
    for s in sources:
        print(f"  {s.cost:<11} {_describe(s, world)}", file=out)
    print(origin, file=out)
    return sources


# calls of every compute op at the largest size that a budget reaching it must allow for: the
# profiler only starts a size when the previous one's time, scaled up, fits what is left
CALLS_AT_LARGEST = 40.0
MAX_SUGGESTED_S = 120


def suggested_budget(profile: Profile, largest: int, budget: float) -> int:
    """Seconds of ``--budget`` that should let the compute timing reach ``largest`` elements:
    the current budget plus ``CALLS_AT_LARGEST`` calls of every compute op at that size, as
    (roughly) predicted; at least twice the current budget, at most ``MAX_SUGGESTED_S``."""
    per_size_s = sum(float(profile.compute_ms(op, largest)) for op in profile.compute) / 1e3
    want = int(budget + CALLS_AT_LARGEST * per_size_s) + 1
    return max(min(want, MAX_SUGGESTED_S), int(2 * budget + 0.999))


def warn_extrapolation(
    profile: Profile,
    sources: list[CostSource],
    largest: int,
    budget: float | None,
    err: TextIO,
    model: str = "MODEL",
) -> bool:
    """Warn on ``err`` about every cost priced far beyond what was measured, saying by how
    much and how to measure further (for ``model``); returns whether it warned."""
    far = far_extrapolations(sources)
    compute = [s for s in far if s.unit == "elements"]
    network = [s for s in far if s.unit == "bytes"]
    if compute:
        worst = max(compute, key=lambda s: s.factor)
        more = suggested_budget(profile, largest, budget or 1.5)
        print(
            f"warning: {', '.join(s.cost for s in compute)} priced up to {worst.factor:,.0f}x "
            f"beyond the largest size measured ({_size(worst.hi or 0, 'elements')} elements) "
            f"for a {largest:,}-element tensor: a straight line continued that far is a guess. "
            f"Measure further: a bigger budget (--budget {more}), or a saved profile "
            f"(hipress profile --model {model} --budget {more} --out p.json, then "
            "hipress plan --profile p.json)",
            file=err,
        )
    for s in network:
        print(
            f"warning: {s.cost} priced at {_size(s.needed, 'bytes')} per rank, {s.factor:,.0f}x "
            f"beyond the largest size measured ({_size(s.hi or 0, 'bytes')}); give the "
            "cluster's link (--bandwidth) to price it from a model instead",
            file=err,
        )
    return bool(far)
