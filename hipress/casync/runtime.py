"""What a :class:`~hipress.casync.state.CaSyncState` runs once it has a plan: :class:`Runtime`,
made by :func:`build_runtime` (the one place it is made: at the plan's adoption and after
unpickling).

A runtime holds the plan, its chunk layout, the per-chunk algorithm states, the digests every
rank agrees on, the bucket context and the step engine. Checkpoints
(:mod:`hipress.casync.persist`) read and restore it; the state holds the configuration and the
binding to a process group.
"""

from __future__ import annotations

import atexit
import dataclasses
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from hipress.casync.config import check_agreement
from hipress.casync.engine import StepEngine
from hipress.casync.rounds_engine import RoundsEngine, rounds_key
from hipress.casync.stats import SyncStats
from hipress.casync.strategies.context import SyncContext
from hipress.casync.strategies.driver import RingDriver
from hipress.casync.unused import UnusedGuard
from hipress.codec.algorithm import init_chunk_states
from hipress.codec.errors import CaSyncError
from hipress.codec.rowsparse import row_states
from hipress.compll.rounds import RoundsAlgorithm
from hipress.core.compression import CompressionAlgorithm, Uncompressed
from hipress.core.layout import PlanLayout, layout_plan
from hipress.core.plan import Plan, Strategy, TensorPlan

__all__ = ["Runtime", "build_runtime", "rounds_states", "state_devices"]


# every live runtime's ring driver, closed and joined when the interpreter exits: a daemon
# thread still running then, or a hop still pending when the process group goes, aborts the
# process
_RINGS: weakref.WeakSet[RingDriver] = weakref.WeakSet()


@atexit.register
def _close_rings() -> None:
    rings = list(_RINGS)
    for ring in rings:
        ring.close()
    for ring in rings:
        ring.join(timeout=120)


@dataclass(eq=False)
class Runtime:
    """The plan-dependent half of a CaSync state on one rank.

    Fields:
        base_plan: the plan as adopted: checkpoints carry it, ranks agree on its digest.
        plan: the plan run now (``base_plan`` with the parameters of the schedule's step).
        layout: the plan's chunks for the current algorithm's payload sizes.
        worker_states, server_states: per-chunk algorithm states (error feedback, momentum,
            RNG counters), by chunk key.
        config: what every rank must agree on, as hex digests (see ``config_digest``).
        ctx: what every bucket operation shares.
        engine: the step engine (step count, bucket layouts, unused-parameter guard).
        agreed: whether the first step's agreement check passed.
    """

    base_plan: Plan
    plan: Plan
    layout: PlanLayout
    worker_states: dict[str, Any]
    server_states: dict[str, Any]
    config: dict[str, str]
    ctx: SyncContext
    engine: StepEngine
    agreed: bool = False

    def parts(self) -> dict[str, dict[str, Any]]:
        """The states by part, as checkpoints name them (``worker``, ``server``)."""
        return {"worker": self.worker_states, "server": self.server_states}

    def agree(self, note: str, group: Any, device: torch.device) -> None:
        """The first step's check that every rank runs the same configuration (``note``
        describes this rank's): see :func:`~hipress.casync.config.check_agreement`."""
        check_agreement(self.config, note, self.ctx.world_size, group, device)
        self.agreed = True

    def watch_unused(self, ddp_model: DistributedDataParallel, names: Mapping[int, str]) -> None:
        """Guard the states of ``ddp_model``'s parameters (``names``: parameter id -> name)
        that no rank uses in a step (see :class:`~hipress.casync.unused.UnusedGuard`)."""
        if self.engine.unused is not None:
            self.engine.unused.remove()
        named = [(names[id(p)], p) for p in ddp_model.module.parameters() if id(p) in names]
        self.engine.unused = UnusedGuard(ddp_model, named, (self.worker_states, self.server_states))

    def switch(self, algorithm: CompressionAlgorithm) -> None:
        """Run ``algorithm`` (the same one with other parameters, its state layout alike)
        from the next step on: the plan's parameters and the chunk layout follow. Between
        steps only."""
        self.plan = dataclasses.replace(self.plan, params=dict(algorithm.params))
        self.layout = layout_plan(self.plan, self.ctx.world_size, algorithm.payload_nbytes)
        self.ctx.algorithm = algorithm
        self.engine.relayout(self.layout)


def build_runtime(
    algorithm: CompressionAlgorithm | RoundsAlgorithm,
    plan: Plan,
    *,
    rank: int,
    world_size: int,
    seed: int,
    devices: Mapping[str, torch.device],
    stats: SyncStats,
    check_finite: bool,
    warmup_steps: int,
    config: dict[str, str],
    on_step_end: Callable[[int], None],
    base_plan: Plan | None = None,
    states: tuple[dict[str, Any], dict[str, Any]] | None = None,
    shapes: Mapping[str, tuple[int, ...] | None] | None = None,
) -> Runtime:
    """The runtime of ``plan`` run with ``algorithm`` on ``rank`` of ``world_size``.

    ``states`` (worker, server) are kept as they are (an unpickled state's); else they are made,
    all zero, with ``seed``. ``base_plan`` is ``plan`` unless given (it differs once a
    parameter schedule switched parameters). The ring's thread ends when the runtime is
    collected, and at the latest when the interpreter exits. A multi-round ``algorithm``
    (:class:`~hipress.compll.rounds.RoundsAlgorithm`) runs on a
    :class:`~hipress.casync.rounds_engine.RoundsEngine`, its states made from the tensors'
    ``shapes`` (one per ``strategy: rounds`` entry, under :func:`rounds_key`).
    """
    multi = isinstance(algorithm, RoundsAlgorithm)
    if multi:  # (its rounds need no chunks: the layout is the plain one's)
        layout = layout_plan(_plain(plan), world_size, None)
    else:
        layout = layout_plan(plan, world_size, algorithm.payload_nbytes)
    if states is None:
        states = (
            (rounds_states(algorithm, plan.entries, devices, shapes or {}), {}) if multi
            else init_chunk_states(algorithm, plan, rank, world_size, seed, devices, layout=layout)
        )  # fmt: skip
        states[0].update(row_states(plan, rank, seed, devices))
    worker, server = states
    ctx = SyncContext(
        rank=rank, world_size=world_size, algorithm=Uncompressed() if multi else algorithm,
        worker_states=worker, server_states=server, stats=stats, check_finite=check_finite,
    )  # fmt: skip
    stats.tracer.rank = rank
    engine = (
        RoundsEngine(ctx, layout, warmup_steps, on_step_end, algorithm, plan, shapes or {})
        if multi else StepEngine(ctx, layout, warmup_steps, on_step_end)
    )  # fmt: skip
    runtime = Runtime(
        base_plan=base_plan or plan, plan=plan, layout=layout, worker_states=worker,
        server_states=server, config=config, ctx=ctx, engine=engine,
    )  # fmt: skip
    weakref.finalize(runtime, ctx.ring.close)
    _RINGS.add(ctx.ring)
    return runtime


def _plain(plan: Plan) -> Plan:
    entries = tuple(
        dataclasses.replace(e, compress=False, strategy=Strategy.ALLREDUCE)
        if e.strategy is Strategy.ROUNDS else e for e in plan.entries
    )  # fmt: skip
    return dataclasses.replace(plan, entries=entries)


def rounds_states(algorithm: RoundsAlgorithm, entries: Sequence[TensorPlan],
                  devices: Mapping[str, torch.device],
                  shapes: Mapping[str, tuple[int, ...] | None]) -> dict[str, Any]:  # fmt: skip
    """The all-zero multi-round states of ``entries`` of ``strategy: rounds``, by key."""
    out = {}
    for e in entries:
        if e.strategy is Strategy.ROUNDS:
            shape = shapes.get(e.name)
            if shape is None:
                raise CaSyncError(f"{e.name}: {algorithm.name} needs the tensor's shape")
            out[rounds_key(e.name)] = algorithm.init_state(shape, devices.get(e.name))
    return out


def state_devices(
    named: Sequence[tuple[str, torch.Tensor | int]], device: torch.device | str | None
) -> tuple[dict[str, torch.device], torch.device | None]:
    """Where each parameter's states live (its own device; for a count, ``device`` or the
    CPU), and the device the model trains on (the first parameter's, else ``device``)."""
    home = torch.device(device) if device is not None else None
    devices = {
        n: p.device if isinstance(p, torch.Tensor) else home or torch.device("cpu")
        for n, p in named
    }
    trained_on = next((p.device for _, p in named if isinstance(p, torch.Tensor)), home)
    return devices, trained_on
