"""SeCoPa for local-step training (DiLoCo): per fragment, whether to compress its outer
gradient, and the compute utilisation that predicts at H inner steps per sync.

A fragment of m elements syncs either uncompressed (one float32 all-reduce: the ``allreduce``
formula) or compressed (each rank's payload all-gathered, the N payloads decoded and averaged:
the ``allgather`` formula), each timed by the :class:`~hipress.secopa.model.costmodel.CostModel`
of the profile (codec speed, link). Its sync overlaps ``delay`` inner steps of ``step_ms``
each, so it costs the training loop ``max(0, sync - delay * step_ms)`` per period (on one
device the codec's compute is not hidden either; the cost model's time holds both). Each
fragment takes the option that leaves less exposed, and uncompressed where both are hidden
(nothing is gained by compressing a sync nobody waits for). Over a period of H steps:

    utilisation = H * step_ms / (H * step_ms + sum over fragments of exposed ms)

Pure and deterministic: the same profile, sizes and schedule give the same choices.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hipress.secopa.model.costmodel import CostModel
from hipress.secopa.model.profile import Profile

__all__ = ["FragmentChoice", "LocalStepPlan", "plan_local_steps"]


@dataclass(frozen=True)
class FragmentChoice:
    """One fragment: its elements, whether to compress, the predicted ms of each option and
    the ms the chosen one leaves exposed per period."""

    numel: int
    compress: bool
    plain_ms: float
    compressed_ms: float
    exposed_ms: float

    @property
    def strategy(self) -> str:
        """The collective: ``allgather`` (compressed) or ``allreduce``."""
        return "allgather" if self.compress else "allreduce"


@dataclass(frozen=True)
class LocalStepPlan:
    """Each fragment's :class:`FragmentChoice`, the schedule and the predicted utilisation
    (None without a compute time per inner step)."""

    fragments: tuple[FragmentChoice, ...]
    sync_every: int
    delay: int
    step_ms: float | None
    utilisation: float | None

    def line(self) -> str:
        """One line for a log."""
        picks = ", ".join(f"{k}: {'compressed' if c.compress else 'uncompressed'} "
                          f"({c.compressed_ms if c.compress else c.plain_ms:.1f} ms)"
                          for k, c in enumerate(self.fragments))  # fmt: skip
        util = "unknown until an inner step is timed" if self.utilisation is None else (
            f"{self.utilisation:.3f}")  # fmt: skip
        return f"fragments {picks}; predicted utilisation at H={self.sync_every}: {util}"


def utilisation(exposed_ms: Sequence[float], step_ms: float, sync_every: int) -> float:
    """Compute's share of a period of ``sync_every`` steps of ``step_ms`` that also waits
    ``exposed_ms`` (one entry per fragment)."""
    work = sync_every * step_ms
    total = work + sum(exposed_ms)
    return 1.0 if total <= 0 else work / total


def plan_local_steps(
    profile: Profile,
    world_size: int,
    fragment_numels: Sequence[int],
    sync_every: int,
    delay: int = 0,
    step_ms: float | None = None,
) -> LocalStepPlan:
    """Choose per fragment (sizes ``fragment_numels``) between an uncompressed all-reduce and
    the profile's algorithm over an all-gather (see the module's description). ``step_ms``:
    compute per inner step (None: treated as 0 for the choice, no utilisation predicted)."""
    if sync_every < 1 or delay < 0:
        raise ValueError(f"sync_every must be >= 1 and delay >= 0, got {sync_every}, {delay}")
    model = CostModel(profile, world_size)
    hidden = delay * (step_ms or 0.0)
    out = []
    for m in fragment_numels:
        plain = model.time("allreduce", float(m)) if world_size > 1 else 0.0
        packed = model.time("allgather", float(m)) if world_size > 1 else 0.0
        e_plain, e_packed = max(0.0, plain - hidden), max(0.0, packed - hidden)
        compress = e_packed < e_plain
        out.append(FragmentChoice(int(m), compress, plain, packed,
                                  e_packed if compress else e_plain))  # fmt: skip
    util = None
    if step_ms is not None:
        util = utilisation([c.exposed_ms for c in out], step_ms, sync_every)
    return LocalStepPlan(tuple(out), sync_every, delay, step_ms, util)
