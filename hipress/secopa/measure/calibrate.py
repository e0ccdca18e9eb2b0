"""Calibration: what a profile measured op by op misses about a real sync step on this host.

The profiler times encode, decode and each collective alone. Inside a CaSync step they do not
run alone: the hook's thread encodes the next bucket while gloo's completion thread decodes the
last one, and on a host with one core per rank (or collectives that are CPU copies, as on
loopback) they share the same core with the transport's threads. Each step also pays CaSync's
own fixed cost per collective: the hook's Python and the hand-offs between threads. With two
ranks on two cores (docs/explanation/secopa.md), decode ran 2.5-3x and encode
1.3-2.4x their profiled cost inside a step, and a layout of tiny tensors took ~2 ms more per
step than predicted.

:func:`calibrate` measures both in the current process group by running CaSync itself on two
synthetic layouts, with the all-compressed plan the profile predicts for them:

- **compute_scale**: a layout of two tensors of ``numel`` elements (two DDP buckets, so the
  second bucket's encode runs while the first's is decoded, as in training). CaSync's own
  per-step encode and decode times (:class:`~hipress.casync.stats.SyncStats`, which leave out
  the calls' waits for each other) divided by the compute the cost model predicts for the same
  plan. It is measured from compute times, not from the step time, so the network's noise does
  not leak into it. Where the model's largest tensor is 4x ``numel`` or more, a second probe
  of that size (up to 64M elements) measures it there, and each op is scaled by its size
  (``Profile.compute_scale_by_size``): the slowdown differs with the size (on loopback, 1.4-1.5x
  at 2M elements, 1.0x at 51M, where the data no longer stays in cache either way).
- **call_ms**: a layout of two tiny tensors (compute and bandwidth negligible): the measured
  step minus the prediction (with the scale above), per collective call.

SeCoPa does not run CaSync itself (CaSync is a layer above it): the caller passes a
:class:`StepProbe` that runs the sync steps, :func:`hipress.casync.profiling.step_probe`.

Every rank must call it; every rank gets the same figures: the scale is the mean of the ranks'
ratios, the call cost the largest rank's excess (the slowest rank sets the step). Needs a ``torch.distributed`` group and a CompLL
algorithm (CaSync runs only those); costs well under a second on loopback, plus about
five steps of the large probe.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any, Protocol

import torch
import torch.distributed as dist

from hipress.core.plan import Plan
from hipress.secopa.measure.broadcast import broadcast_plan
from hipress.secopa.model.planner import Planner
from hipress.secopa.model.profile import Profile

__all__ = ["StepProbe", "calibrate"]

SCALE_RANGE = (0.5, 10.0)  # a measured compute_scale is clipped to this
CALL_MS_MAX = 50.0
TINY = 256  # elements per tensor of the call-overhead probe


class StepProbe(Protocol):
    """Runs real sync steps of ``algorithm`` under ``plan`` on synthetic gradients of the
    tensors ``named`` (``(name, numel)`` pairs), in ``group`` on ``device``: ``warmup`` steps,
    then ``steps`` measured ones. Returns the median measured step time in ms on this rank and
    the sync engine's mean per-step figures over the measured steps (at least ``encode_ms``
    and ``decode_ms``: compute only, without waits between threads). Every rank calls it."""

    def __call__(
        self,
        algorithm: Any,
        plan: Plan,
        named: list[tuple[str, int]],
        group: Any,
        warmup: int,
        steps: int,
        device: Any = None,
    ) -> tuple[float, dict[str, float]]: ...


def _max(x: float, group: Any, device: Any = None) -> float:
    t = torch.tensor([x], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())


def _gather(x: float, group: Any, device: Any = None) -> list[float]:
    out = [
        torch.zeros(1, dtype=torch.float64, device=device)
        for _ in range(dist.get_world_size(group))
    ]
    dist.all_gather(out, torch.tensor([x], dtype=torch.float64, device=device), group=group)
    return [float(t.item()) for t in out]


def _probe(
    probe: StepProbe,
    algorithm: Any,
    profile: Profile,
    named: list[tuple[str, int]],
    group: Any,
    warmup: int,
    steps: int,
    device: Any = None,
) -> tuple[Plan, float, dict[str, float]]:
    """Run ``probe`` on ``named`` with rank 0's all-compressed plan, on ``device``; return (plan,
    median step ms on this rank, the engine's mean per-step figures over the measured steps)."""
    world = dist.get_world_size(group)
    mine = None
    if dist.get_rank(group) == 0:
        mine = Planner(profile, world).baseline(named, compress=True)
    plan = broadcast_plan(mine, group)
    step_ms, stats = probe(algorithm, plan, named, group, warmup, steps, device)
    return plan, step_ms, stats


def _scale_probe(
    probe: StepProbe, algorithm: Any, base: Profile, numel: int, group: Any, warmup: int,
    steps: int, device: Any = None,
) -> tuple[float, dict[str, Any]]:  # fmt: skip
    """The compute scale at ``numel`` elements per tensor (two tensors: two buckets), and its
    record."""
    world = dist.get_world_size(group)
    big = [("probe.a", numel), ("probe.b", numel)]
    plan, big_ms, stats = _probe(probe, algorithm, base, big, group, warmup, steps, device)
    predicted = Planner(base, world).breakdown(plan)
    measured_compute = stats.get("encode_ms", 0.0) + stats.get("decode_ms", 0.0)
    ratio = measured_compute / predicted["compute_ms"] if predicted["compute_ms"] > 1e-3 else 1.0
    ratios = _gather(ratio, group, device)
    scale = min(max(statistics.fmean(ratios), SCALE_RANGE[0]), SCALE_RANGE[1])
    record = {
        "numel": numel,
        "compute_scale": round(scale, 4),
        "compute_ratio_per_rank": [round(r, 4) for r in ratios],
        "probe_compute_ms": {
            "predicted": round(predicted["compute_ms"], 4),
            "measured": round(measured_compute, 4),
        },
        "probe_step_ms": {
            "before": round(Planner(base, world).predict(plan), 4),
            "after": round(Planner(replace(base, compute_scale=scale), world).predict(plan), 4),
            "measured": round(_max(big_ms, group, device), 4),
        },
    }
    return scale, record


def calibrate(
    algorithm: Any,
    profile: Profile,
    group: Any = None,
    numel: int = 1 << 20,
    warmup: int = 3,
    steps: int = 12,
    large: int | None = None,
    large_steps: tuple[int, int] = (1, 4),
    device: Any = None,
    *,
    probe: StepProbe,
) -> Profile:
    """``profile`` with ``compute_scale`` and ``call_ms`` measured in ``group`` (see the module
    docstring); its ``meta["calibration"]`` records the probes. With ``large`` (elements, the
    model's largest tensor) at least 4x ``numel``, the scale is measured there too (``large_steps``:
    warm-up and measured steps) and the profile scales each op by the size it runs on
    (``compute_scale_by_size``). ``device``: where the probes run (the model's; default CPU).
    ``probe`` runs the sync steps (see :class:`StepProbe`). Every rank must call it."""
    numel = max(int(numel), 4 * TINY)
    base = replace(profile, compute_scale=1.0, call_ms=0.0, compute_scale_by_size=())
    world = dist.get_world_size(group)

    scale, record = _scale_probe(probe, algorithm, base, numel, group, warmup, steps, device)
    points = [(float(numel), scale)]
    records = [record]
    if large is not None and large >= 4 * numel:
        big_scale, big_record = _scale_probe(
            probe, algorithm, base, int(large), group, *large_steps, device
        )
        points.append((float(large), big_scale))
        records.append(big_record)
    scaled = replace(base, compute_scale=scale, compute_scale_by_size=tuple(points))
    tiny = [("tiny.a", TINY), ("tiny.b", TINY)]
    tplan, tiny_ms, _ = _probe(probe, algorithm, scaled, tiny, group, warmup, steps, device)
    calls = max(Planner(scaled, world).breakdown(tplan)["rounds"], 1.0)
    excess = _max(tiny_ms - Planner(scaled, world).predict(tplan), group, device)
    call_ms = min(max(excess / calls, 0.0), CALL_MS_MAX)

    out = replace(scaled, call_ms=call_ms)
    meta = dict(profile.meta)
    meta["calibration"] = {
        **records[0],
        "call_ms": round(call_ms, 4),
        "probes": records,
        "tiny_step_ms": {"measured": round(_max(tiny_ms, group, device), 4), "calls": calls},
    }
    return replace(out, meta=meta)
