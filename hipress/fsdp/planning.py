"""Which FSDP units :func:`~hipress.fsdp.register` compresses: :func:`plan_units`.

Three ways to decide, chosen by ``plan``:

- ``"default"``: the default size rule (:class:`~hipress.core.rule.DefaultRule`): units of
  fewer than ``min_compress_numel`` padded elements stay plain.
- ``"auto"``: SeCoPa's cost model, per unit. FSDP2's plain reduce-scatter of the unit's padded
  gradient in its reduce dtype is priced against the compressed one (N encodes, one
  all_to_all of the payloads, the average of N payloads) with
  :func:`~hipress.secopa.model.formulas.reduce_scatter_formulas`. The costs come from ``profile``
  if given (without a ``reduce_scatter`` cost, its ``all_to_all`` prices it: right for a
  link, low for gloo's reduce-scatter), else from a profile measured in the unit's process
  group: the collectives and the algorithm's compute as DDP's ``plan="auto"`` measures them,
  the reduce-scatter itself, and a calibration against hipress's compressed reduce-scatter
  (:mod:`hipress.fsdp.calibrate`) in place of CaSync's steps. A unit is compressed only where
  the compressed prediction is at least ``margin`` (10%) below the plain one. Global rank 0's
  decisions are broadcast, so every rank runs the same collective.
- a mapping ``{unit name: bool}`` (units it leaves out follow the size rule), a callable
  ``unit name -> bool``, or an :class:`FsdpPlan` (its decisions, made again): the user's
  decisions, checked to be the same on every rank.

None means ``"default"``, as for the DDP hook. A per-parameter
:class:`~hipress.core.plan.Plan` (or its file) is DDP's and Horovod's: FSDP refuses it, saying so.

The result is an :class:`FsdpPlan`: a :class:`UnitPlan` per unit, with the modelled times where
SeCoPa priced it, and a table to print.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hipress.core.compression import CompressionAlgorithm
from hipress.core.plan import Plan
from hipress.core.rule import DefaultRule
from hipress.fsdp.calibrate import calibrate
from hipress.fsdp.collective import TRAILER
from hipress.fsdp.errors import FsdpError
from hipress.fsdp.feedback import resolve_feedback
from hipress.secopa.measure.comm import TorchComm
from hipress.secopa.measure.netprofiler import measure_collective
from hipress.secopa.measure.runtime import auto_profile
from hipress.secopa.measure.timed_codec import TimedCodecError
from hipress.secopa.model.costmodel import CostModel
from hipress.secopa.model.formulas import reduce_scatter_formulas
from hipress.secopa.model.profile import Profile, ProfileError

__all__ = [
    "MARGIN",
    "PLANS",
    "FsdpPlan",
    "UnitInfo",
    "UnitPlan",
    "check_plan_arg",
    "local_decisions",
    "plan_units",
    "price_unit",
]

PLANS = ("default", "auto")
# "auto" compresses a unit only where the compressed prediction is this fraction of the plain
# one below it: the model's errors then do not flip units whose two costs are close
MARGIN = 0.1
PROFILE_BUDGET_S = 1.0  # compute-profiling budget of "auto" at registration


@dataclass(frozen=True)
class UnitInfo:
    """What planning needs of one FSDP unit: its name, padded element count (the
    reduce-scatter's input), the size of its reduce-scatter group, its reduce dtype and that
    group (measured by ``"auto"``)."""

    name: str
    numel: int
    world_size: int
    dtype: torch.dtype
    group: Any = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class UnitPlan:
    """The decision for one unit.

    Fields:
        unit: the module's name (``"<root>"`` for the root).
        numel: padded elements of its reduce-scatter input.
        world_size: ranks of its reduce-scatter group.
        dtype: its reduce dtype (``"float32"``, ``"bfloat16"``, ...).
        compress: whether its reduce-scatter is compressed.
        source: ``"default"`` (size rule), ``"auto"`` (SeCoPa) or ``"explicit"`` (the user).
        plain_ms, compressed_ms: SeCoPa's predictions for the plain and compressed
            reduce-scatter (``"auto"`` only, else None; ``inf`` where it cannot compress).
    """

    unit: str
    numel: int
    world_size: int
    dtype: str
    compress: bool
    source: str
    plain_ms: float | None = None
    compressed_ms: float | None = None


@dataclass(frozen=True)
class FsdpPlan:
    """Every unit's :class:`UnitPlan` (``units``, by name, in registration order), how they
    were decided (``kind``: ``"default"``, ``"auto"`` or ``"explicit"``) and, for
    ``"auto"``, the margin, the profile's network source and its calibration record, if
    measured (``meta``: ``margin``, ``network``, ``calibration``). ``str()`` is
    :meth:`table`."""

    kind: str
    units: Mapping[str, UnitPlan]
    meta: Mapping[str, Any] = field(default_factory=dict)

    def compressed(self) -> list[str]:
        """The names of the compressed units."""
        return [k for k, u in self.units.items() if u.compress]

    def mapping(self) -> dict[str, bool]:
        """``{unit: compress}``: pass it as ``plan=`` to make the same decisions again."""
        return {k: u.compress for k, u in self.units.items()}

    def table(self) -> str:
        """A fixed-width table of the decisions, one line per unit, with a heading."""
        head = f"hipress.fsdp plan ({self.kind}"
        if "margin" in self.meta:
            head += f", margin {self.meta['margin']:.0%}"
        if "network" in self.meta:
            head += f", network {self.meta['network']}"
        cal = self.meta.get("calibration")
        if cal:
            head += f", compute x{cal['compute_scale']:.2f}"
        head += f"): {len(self.compressed())} of {len(self.units)} units compressed"
        rows = [("unit", "elements", "ranks", "dtype", "plain ms", "compressed ms", "compress")]
        for u in self.units.values():
            verdict = "yes" if u.compress else "no"
            if u.source != self.kind:  # a unit an explicit mapping left to the size rule
                verdict += f" ({u.source})"
            rows.append((u.unit, str(u.numel), str(u.world_size), u.dtype, _ms(u.plain_ms),
                         _ms(u.compressed_ms), verdict))  # fmt: skip
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        left = (0, 3, 6)  # text columns; numbers align right
        lines = []
        for r in rows:
            cells = [c.ljust(w) if i in left else c.rjust(w)
                     for i, (c, w) in enumerate(zip(r, widths, strict=True))]  # fmt: skip
            lines.append("  ".join(cells).rstrip())
        return "\n".join([head, *lines])

    def __str__(self) -> str:
        return self.table()


# what register's ``plan=`` takes (see the module docstring); None is "default"
PlanArg = str | FsdpPlan | Mapping[str, bool] | Callable[[str], bool] | None


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def check_plan_arg(plan: Any, profile: Any) -> str:
    """The kind of ``plan`` (``"default"``, ``"auto"`` or ``"explicit"``), checked before
    anything is built. Raises :class:`FsdpError` naming the choices, or if ``profile`` is
    given without ``plan="auto"``."""
    if plan is None:
        kind = "default"
    elif isinstance(plan, str) and plan in PLANS:
        kind = plan
    elif isinstance(plan, Mapping | FsdpPlan) or (callable(plan) and not isinstance(plan, str)):
        kind = "explicit"
    else:
        why = ""
        if isinstance(plan, str) and plan.strip().lower() in PLANS:
            why = f"did you mean plan={plan.strip().lower()!r}? "
        elif isinstance(plan, str | Path | Plan):
            why = "a per-parameter plan (a Plan or plan file) is for DDP and Horovod; FSDP "
            why += "decides per unit, so "
        raise FsdpError(
            f"{why}plan must be 'default' (or None: the size rule), 'auto' (SeCoPa decides per "
            f"unit), an FsdpPlan, a mapping {{unit name: bool}} or a callable unit name -> bool; "
            f"got {plan!r}"
        )
    if profile is not None and kind != "auto":
        raise FsdpError(f"profile= is what plan='auto' prices with; plan={plan!r} does not use it")
    if profile is not None and not isinstance(profile, Profile | str | Path):
        raise FsdpError(f"profile must be a secopa Profile or a path to one, got {profile!r}")
    return kind


def plan_units(
    plan: PlanArg,
    units: Sequence[UnitInfo],
    algorithm: CompressionAlgorithm,
    rule: DefaultRule,
    *,
    profile: Profile | str | Path | None = None,
    device: torch.device | None = None,
    feedback: str = "auto",
    margin: float = MARGIN,
) -> FsdpPlan:
    """Decide, for every unit, whether its reduce-scatter is compressed (see the module
    docstring). A collective over the default group for ``"auto"`` and explicit plans: every
    rank must call it with the same units. ``profile`` (a :class:`Profile` or its JSON file)
    replaces the measurement of ``"auto"``; ``device`` is where the units train and
    ``feedback`` the option they run with (measured so, :mod:`hipress.fsdp.calibrate`).
    Returns the :class:`FsdpPlan`, the same on every rank. Raises :class:`FsdpError` for a bad
    plan, a mapping naming no unit, ranks that decide differently, or a profile that cannot
    price ``algorithm``."""
    kind = check_plan_arg(plan, profile)
    got = local_decisions(plan, units, rule)
    if got is None:
        fb = resolve_feedback(algorithm, feedback)
        got, meta = _auto(units, algorithm, profile, device, fb, margin)
        return FsdpPlan(kind, got, {"margin": margin, **meta})
    if kind == "explicit":
        _check_agreement(got)
    return FsdpPlan(kind, got)


def local_decisions(
    plan: PlanArg, units: Sequence[UnitInfo], rule: DefaultRule
) -> dict[str, UnitPlan] | None:
    """This rank's decisions for ``"default"`` and explicit plans, without communicating
    (None for ``"auto"``, which measures). Raises :class:`FsdpError` as :func:`plan_units`."""
    kind = check_plan_arg(plan, None)
    if isinstance(plan, FsdpPlan):
        plan = plan.mapping()
    if kind == "default":
        return {u.name: _by_rule(u, rule) for u in units}
    return _explicit(plan, units, rule) if kind == "explicit" else None


def _dtype(u: UnitInfo) -> str:
    return str(u.dtype).removeprefix("torch.")


def _by_rule(u: UnitInfo, rule: DefaultRule) -> UnitPlan:
    on = rule.entry(u.name, u.numel, u.world_size).compress
    return UnitPlan(u.name, u.numel, u.world_size, _dtype(u), on, "default")


def _explicit(plan: Any, units: Sequence[UnitInfo], rule: DefaultRule) -> dict[str, UnitPlan]:
    names = [u.name for u in units]
    if isinstance(plan, Mapping):
        unknown = sorted(str(k) for k in plan if k not in names)
        if unknown:
            raise FsdpError(
                f"plan names {unknown}, which are not FSDP units; the units are {names}"
            )
    out: dict[str, UnitPlan] = {}
    for u in units:
        if isinstance(plan, Mapping):
            if u.name not in plan:
                out[u.name] = _by_rule(u, rule)
                continue
            on = plan[u.name]
        else:
            try:
                on = plan(u.name)
            except Exception as exc:
                raise FsdpError(
                    f"the plan callable raised for unit {u.name!r}: {type(exc).__name__}: {exc}"
                ) from exc
        if not isinstance(on, bool):
            raise FsdpError(f"plan's decision for {u.name} must be True or False, got {on!r}")
        out[u.name] = UnitPlan(u.name, u.numel, u.world_size, _dtype(u), on, "explicit")
    return out


def _check_agreement(got: Mapping[str, UnitPlan]) -> None:
    """Raise on every rank if the ranks' decisions differ (a rank that compresses a unit and
    one that does not would run different collectives)."""
    world = dist.get_world_size()
    if world == 1:
        return
    mine = [(k, u.compress) for k, u in got.items()]
    every: list[Any] = [None] * world
    dist.all_gather_object(every, mine)
    differ = [r for r in range(world) if every[r] != every[0]]
    if differ:
        raise FsdpError(
            f"ranks 0 and {differ[0]} decide differently which units to compress "
            f"({every[0]} vs {every[differ[0]]}); give every rank the same plan"
        )


def _load(profile: Profile | str | Path) -> Profile:
    try:
        return profile if isinstance(profile, Profile) else Profile.load(profile)
    except ProfileError as exc:
        raise FsdpError(str(exc)) from None


def _network(profile: Profile) -> str:
    src = profile.meta.get("network_source", {})
    if isinstance(src, Mapping) and src.get("kind") == "link":
        gbit = float(src.get("bandwidth_bytes_per_s", 0.0)) * 8 / 1e9
        return f"link {gbit:g} Gbit/s, {float(src.get('latency_s', 0.0)) * 1e6:g} us"
    if isinstance(src, Mapping) and src.get("kind") == "measured":
        return f"measured over {src.get('backend', '?')} at {src.get('world_size', '?')} ranks"
    return "given"


def price_unit(
    profile: Profile, numel: int, world_size: int, dtype: torch.dtype, margin: float = MARGIN
) -> tuple[float, float, bool]:
    """SeCoPa's predictions for one unit: ``(plain ms, compressed ms, compress)``, where
    ``compress`` is whether the compressed one is at least ``margin`` below the plain one
    (the compressed time is ``inf`` for fewer elements than ranks). Pure."""
    grad_bytes = torch.empty((), dtype=dtype).element_size()
    model = CostModel(profile, world_size, reduce_scatter_formulas(grad_bytes, TRAILER), 1)
    plain = model.time("reduce_scatter", numel)
    comp = model.time("compressed_reduce_scatter", numel)
    return plain, comp, world_size > 1 and comp <= (1.0 - margin) * plain


def _auto(
    units: Sequence[UnitInfo],
    algorithm: CompressionAlgorithm,
    profile: Profile | str | Path | None,
    device: torch.device | None,
    feedback: str,
    margin: float,
) -> tuple[dict[str, UnitPlan], dict[str, Any]]:
    if profile is not None:
        prof = _load(profile)
        if prof.algorithm != algorithm.name:
            raise FsdpError(
                f"the profile is for {prof.algorithm!r}, the units run {algorithm.name!r}; "
                "profile this algorithm (hipress profile) or leave profile= out to measure"
            )
        profiles = {id(u.group): prof for u in units}
    else:
        # one measurement per reduce-scatter group (every rank measures its own group's; the
        # same units on every rank, so the calls match), up to the largest unit's size
        profiles = {}
        for u in units:
            if id(u.group) in profiles or u.world_size == 1:
                continue
            top = max(v.numel for v in units if v.group is u.group)
            try:
                prof = auto_profile(
                    algorithm, u.group, PROFILE_BUDGET_S, overlap=False, max_numel=top,
                    calibrate_step=False, device=device,
                )  # fmt: skip
                # and the plain collective itself: not always its all_to_all's cost (gloo's
                # reduce-scatter takes longer than its allreduce)
                rs = measure_collective("reduce_scatter", "ring_reducescatter", u.group,
                                        device=device)  # fmt: skip
            except (TimedCodecError, ProfileError) as exc:
                raise FsdpError(f"plan='auto' cannot profile {algorithm.name}: {exc}") from None
            prof = dataclasses.replace(prof, network={**prof.network, "reduce_scatter": rs})
            where = device if device is not None else torch.device("cpu")
            profiles[id(u.group)] = calibrate(prof, algorithm, feedback, u.group, where, top)
    mine: dict[str, UnitPlan] = {}
    for u in units:
        if u.world_size == 1:  # nothing to send: FSDP2's own copy
            mine[u.name] = UnitPlan(u.name, u.numel, 1, _dtype(u), False, "auto", 0.0, math.inf)
            continue
        plain, comp, on = price_unit(profiles[id(u.group)], u.numel, u.world_size, u.dtype, margin)
        mine[u.name] = UnitPlan(u.name, u.numel, u.world_size, _dtype(u), on, "auto", plain, comp)
    first = next(iter(profiles.values()), None)
    meta = {
        "network": _network(first) if first is not None else "none (one rank)",
        "calibration": first.meta.get("calibration") if first is not None else None,
    }
    # rank 0's decisions everywhere: each rank timed its own compute
    got = TorchComm(None).broadcast_object((mine, meta) if dist.get_rank() == 0 else None)
    return got[0], got[1]
