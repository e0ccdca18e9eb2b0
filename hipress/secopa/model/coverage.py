"""What a plan's costs rest on: for each cost of a profile, where it comes from and over what
size range it was measured, next to the largest size the plan prices with it.

A piecewise-linear compute cost knows its measured range (its knots); a measured collective
knows its sizes and the world size it was measured at; a given link is an alpha-beta model and
holds at any size. :func:`cost_sources` lists them for a model's largest tensor and a world
size; :func:`far_extrapolations` picks those priced far beyond what was measured, so the CLI
can warn and say how to measure further. Pure functions of the profile: no timing here.
"""

from __future__ import annotations

from dataclasses import dataclass

from hipress.secopa.model.costfn import AffineFloor, PiecewiseLinear
from hipress.secopa.model.profile import COLLECTIVES, COMPUTE_OPS, AlphaBeta, MeasuredComm, Profile

__all__ = ["FAR", "CostSource", "cost_sources", "far_extrapolations"]

# a cost priced beyond this multiple of its largest measured size is called out
FAR = 8.0


@dataclass(frozen=True)
class CostSource:
    """One cost of a profile and what it rests on.

    Fields:
        cost: the operation (``encode``, ``allreduce``, ...).
        kind: ``measured`` (samples over ``lo..hi``), ``link`` (a given alpha-beta model, any
            size), ``fit`` (constants without a measured range).
        unit: ``elements`` (compute) or ``bytes`` (per rank, network).
        lo, hi: the measured size range (None unless ``measured``).
        needed: the largest size the plan prices with this cost.
        measured_world: the world size a measured collective was timed at (else None).
    """

    cost: str
    kind: str
    unit: str
    lo: float | None
    hi: float | None
    needed: float
    measured_world: int | None = None

    @property
    def factor(self) -> float:
        """How far beyond the largest measured size the plan prices (1.0 if within)."""
        if self.hi is None or self.hi <= 0:
            return 1.0
        return max(1.0, self.needed / self.hi)


def _compute_source(profile: Profile, op: str, needed: float) -> CostSource:
    fn = profile.compute[op]
    if isinstance(fn, PiecewiseLinear):
        return CostSource(op, "measured", "elements", fn.x[0], fn.x[-1], needed)
    samples = dict(profile.meta.get("compute_samples", {})).get(op)
    if isinstance(fn, AffineFloor) and samples and samples[0]:
        xs = [float(v) for v in samples[0]]
        return CostSource(op, "measured", "elements", min(xs), max(xs), needed)
    return CostSource(op, "fit", "elements", None, None, needed)


def _network_source(profile: Profile, op: str, needed: float) -> CostSource:
    comm = profile.network[op]
    if isinstance(comm, MeasuredComm):
        return CostSource(
            op, "measured", "bytes", comm.sizes[0], comm.sizes[-1], needed, comm.world_size
        )
    if isinstance(comm, AlphaBeta):
        return CostSource(op, "link", "bytes", None, None, needed)
    return CostSource(op, "fit", "bytes", None, None, needed)


def cost_sources(profile: Profile, largest: int) -> list[CostSource]:
    """Every measured compute cost and every CaSync collective of ``profile``, each with the
    largest size a plan for a model whose biggest tensor has ``largest`` elements prices with
    it: ``largest`` elements for compute, ``4 * largest`` bytes for the allreduce (float32
    uncompressed), the payload of ``largest`` elements for the other collectives."""
    ops = sorted(
        profile.compute,
        key=lambda op: (
            op not in COMPUTE_OPS,
            COMPUTE_OPS.index(op) if op in COMPUTE_OPS else 0,
            op,
        ),
    )
    out = [_compute_source(profile, op, float(largest)) for op in ops]
    payload = float(profile.payload.nbytes(largest))
    for op in COLLECTIVES:
        out.append(_network_source(profile, op, 4.0 * largest if op == "allreduce" else payload))
    return out


def far_extrapolations(sources: list[CostSource], far: float = FAR) -> list[CostSource]:
    """The sources priced more than ``far`` times beyond their largest measured size."""
    return [s for s in sources if s.factor > far]
