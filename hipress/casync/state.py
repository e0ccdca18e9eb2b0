"""The state of the CaSync DDP hook: :class:`CaSyncState`, one per DDP model and rank.

It checks the configuration eagerly (:mod:`hipress.casync.config`), binds to its process group
when there is one (at construction, else at the first use), lays out the plan's chunks once
(:class:`~hipress.core.layout.PlanLayout`), holds the per-chunk algorithm states and their
checkpoints (:mod:`hipress.codec.checkpoint`), checks at the first step that every rank agrees,
and hands each bucket to its step engine (:mod:`hipress.casync.engine`).
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from hipress.casync.config import (
    check_agreement,
    check_options,
    check_schedule,
    config_digest,
    describe,
    params_at,
)
from hipress.casync.engine import StepEngine
from hipress.casync.persist import Checkpoints
from hipress.casync.probe import StateProbe
from hipress.casync.stats import SyncStats
from hipress.casync.strategies.context import SyncContext
from hipress.casync.strategies.ring import RingDriver
from hipress.casync.trace import Tracer
from hipress.casync.unused import UnusedGuard
from hipress.codec.algorithm import build_kernels, init_chunk_states, resolve_algorithm
from hipress.codec.errors import CaSyncError, CommError
from hipress.codec.logs import RANK_FILTER
from hipress.codec.planning import check_plan_arg, resolve_plan
from hipress.core.compression import CompressionAlgorithm
from hipress.core.layout import PlanLayout, layout_plan
from hipress.core.plan import Plan
from hipress.core.rule import DefaultRule

__all__ = ["CaSyncState"]

logger = logging.getLogger(__name__)
logger.addFilter(RANK_FILTER)

# every live state's ring driver, closed and joined when the interpreter exits: a daemon thread
# still running then, or a hop still pending when the process group goes, aborts the process
_RINGS: weakref.WeakSet[RingDriver] = weakref.WeakSet()


@atexit.register
def _close_rings() -> None:
    rings = list(_RINGS)
    for ring in rings:
        ring.close()
    for ring in rings:
        ring.join(timeout=120)


class CaSyncState(Checkpoints):
    """State of :func:`~hipress.casync.hook.casync_hook` for one DDP model on one rank.

    Args:
        algorithm: a CompLL algorithm name, an algorithm object, or None for no compression.
        params: the algorithm's hyper-parameters (with a name only).
        named_parameters: (name, parameter) pairs of every parameter that receives a gradient,
            or (name, numel) pairs when there is no model (benchmarks).
        plan: a :class:`~hipress.core.plan.Plan`, a plan file, ``"auto"`` or None (default rule).
        process_group: group to synchronise over (None: the default group).
        seed: base RNG seed; each rank mixes its rank in.
        backend: CompLL backend for a named algorithm ("auto", "cpu", "reference").
        rule: the default rule used when ``plan`` is None.
        check_finite: look for NaN/Inf in every bucket (one pass) so they reach every rank
            and do not poison error feedback. Disable only if the model cannot produce them.
        log_every: log a summary every this many steps (0: never).
        warmup_steps: synchronise the first this many steps uncompressed (DDP's own allreduce,
            bit for bit), leaving every algorithm state untouched; compression starts at step
            ``warmup_steps`` (like ``start_powerSGD_iter`` of PyTorch's PowerSGD hook, and
            DGC's warm-up). The step count is kept in :meth:`state_dict`.
        params_schedule: ``(step, params)`` pairs, steps ascending: from that step on, the
            algorithm runs with ``params`` updating the earlier ones, keeping every state
            (error feedback, momentum, RNG counters). E.g. DGC's warm-up, which sends a larger
            fraction in the first epochs: ``[(0, {"s_percent": 0.25}), (500, {"s_percent":
            0.0625}), ...]``. Part of the configuration every rank must agree on; only for an
            algorithm given by name, and only parameters that leave its state layout as it is.
            The plan keeps its decisions. A restored :meth:`state_dict` resumes with the
            parameters of its step.

    Fields:
        algorithm, seed: as resolved at construction.
        rank, world_size: of the process group, once bound (None before).
        plan: the plan run (a property: see below).
        stats: :class:`~hipress.casync.stats.SyncStats` of this rank.
        worker_states, server_states: per-chunk algorithm states (error feedback, momentum),
            made with the plan.

    Everything after ``algorithm`` is keyword-only. Validation happens here, eagerly: a bad
    option, algorithm or plan file raises before training starts. The state binds to its
    process group at construction if ``torch.distributed`` is initialised, else at its first
    use (the first hook call, :meth:`load_state_dict`, :meth:`state_dict`): so it can be built
    before ``init_process_group``, e.g. for Lightning's
    ``DDPStrategy(ddp_comm_state=state, ddp_comm_hook=casync_hook)``; a plan that does not fit
    the world size raises then. With ``plan="auto"``, SeCoPa plans at the first step (every
    rank takes part), unless :meth:`load_state_dict` brought the plan of a checkpoint first.
    The state pickles without its process group, parameter binding, buffers and in-flight
    work; after unpickling, :meth:`bind` it to the model and register it again.
    """

    def __init__(
        self,
        algorithm: str | CompressionAlgorithm | None = "terngrad",
        *,
        params: Mapping[str, Any] | None = None,
        named_parameters: Iterable[tuple[str, torch.Tensor | int]],
        plan: Plan | str | Path | None = None,
        process_group: dist.ProcessGroup | None = None,
        seed: int = 0,
        backend: str = "auto",
        rule: DefaultRule | None = None,
        check_finite: bool = True,
        log_every: int = 100,
        warmup_steps: int = 0,
        params_schedule: Sequence[tuple[int, Mapping[str, Any]]] = (),
        device: torch.device | str | None = None,
    ) -> None:
        check_options(params, seed, rule, check_finite, log_every, warmup_steps, plan)
        schedule = check_schedule(params_schedule, algorithm, params)
        named = list(named_parameters)
        if not named:
            raise CaSyncError("the model has no parameter that requires a gradient")
        self._numels = [(n, int(p) if isinstance(p, int) else p.numel()) for n, p in named]
        self._devices, self._trained_on = _devices(named, device)
        self.process_group = process_group
        self.rank: int | None = None
        self.world_size: int | None = None
        self._spec = (
            (algorithm, dict(params or {}), backend) if isinstance(algorithm, str) else None
        )
        self.algorithm = resolve_algorithm(algorithm, params, backend)
        build_kernels(self.algorithm, self._devices.values())
        self._plan_arg = check_plan_arg(plan, self.algorithm)
        self._rule = rule
        self._plan: Plan | None = None
        self.seed = int(seed)
        self.check_finite = bool(check_finite)
        self.warmup_steps = warmup_steps
        self.params_schedule = schedule
        self._base_params = dict(params or {})
        self.stats = SyncStats(log_every=log_every)
        self._init_local()
        self.bind(named)
        if dist.is_initialized():
            self._attach()

    @property
    def plan(self) -> Plan:
        """The plan this state runs. With ``plan="auto"``, reading it before the first step
        (and before a :meth:`load_state_dict` that brings one) makes it now: every rank must
        then read it."""
        if self._plan is None:
            self._ready()
        assert self._plan is not None
        return self._plan

    @plan.setter
    def plan(self, plan: Plan) -> None:
        self._plan = plan

    def _attach(self) -> None:
        """Bind to the process group: rank, world size and, unless it is ``"auto"`` (made at
        the first step), the plan with its states. Idempotent."""
        if self.rank is not None:
            return
        if not dist.is_initialized():
            raise CaSyncError(
                "torch.distributed is not initialised: call init_process_group before the "
                "first step (the state binds to its process group then)"
            )
        self.rank = dist.get_rank(self.process_group)
        self.world_size = dist.get_world_size(self.process_group)
        if not (isinstance(self._plan_arg, str) and self._plan_arg == "auto"):
            self._adopt(self._resolve(self._plan_arg))

    def _ready(self) -> None:
        """Bound, with a plan: SeCoPa's for ``"auto"`` (a collective over the group)."""
        self._attach()
        if self._plan is None:
            self._adopt(self._resolve("auto"))

    def _resolve(self, plan: Plan | str | Path | None) -> Plan:
        assert self.world_size is not None
        return resolve_plan(
            plan, self.algorithm, self._numels, self.world_size, self._rule,
            group=self.process_group, device=self._trained_on, probe=StateProbe(type(self)),
        )  # fmt: skip

    def _adopt(self, plan: Plan) -> None:
        """Run ``plan`` (checked): lay it out, make its states (all zero) and the runtime."""
        assert self.rank is not None and self.world_size is not None
        self._plan = self._base_plan = plan
        self._relayout()
        self.worker_states, self.server_states = init_chunk_states(
            self.algorithm, plan, self.rank, self.world_size, self.seed, self._devices,
            layout=self._layout,
        )  # fmt: skip
        self._base_digests = (self.algorithm.digest, plan.digest())
        self._init_runtime()
        if self.params_schedule:
            self._apply_params(params_at(self._base_params, self.params_schedule, 0))
        if self._unused_model is not None:
            self.watch_unused(self._unused_model)
        compressed = sum(e.compress for e in plan.entries)
        logger.info(
            "casync: %s, %d of %d tensors compressed, world size %d",
            plan.algorithm, compressed, len(plan.entries), self.world_size,
        )  # fmt: skip

    def _relayout(self) -> None:
        """Lay out the plan's chunks for the current algorithm (its payload sizes), once."""
        assert self.world_size is not None
        self._layout: PlanLayout = layout_plan(
            self.plan, self.world_size, self.algorithm.payload_nbytes
        )

    def _init_local(self) -> None:
        """What does not pickle and exists before the plan: the binding and the lock."""
        self._param_names: dict[int, str] = {}
        self._lock = threading.Lock()
        self._unused_model: DistributedDataParallel | None = None

    def _init_runtime(self) -> None:
        """What does not pickle and needs the plan: the bucket context and the step engine."""
        assert self.rank is not None and self.world_size is not None
        self._ctx = SyncContext(
            rank=self.rank,
            world_size=self.world_size,
            algorithm=self.algorithm,
            worker_states=self.worker_states,
            server_states=self.server_states,
            stats=self.stats,
            check_finite=self.check_finite,
        )
        self.stats.tracer.rank = self.rank
        # the ring's thread ends with this state (it holds the driver, never the state), and
        # at the latest when the interpreter exits
        weakref.finalize(self, self._ctx.ring.close)
        _RINGS.add(self._ctx.ring)
        self._engine = StepEngine(self._ctx, self._layout, self.warmup_steps, self._after_step)
        self._agreed = False

    # ---- binding and configuration ----------------------------------------------------------

    def bind(self, named_parameters: Iterable[tuple[str, torch.Tensor | int]]) -> None:
        """Map the model's parameter objects to their names (buckets list parameter objects)."""
        self._param_names = {id(p): n for n, p in named_parameters if isinstance(p, torch.Tensor)}

    def names_of(self, parameters: Sequence[torch.Tensor]) -> list[str]:
        """Names of a bucket's parameters; raises if one was not bound."""
        try:
            return [self._param_names[id(p)] for p in parameters]
        except KeyError:
            raise CaSyncError(
                "a bucket holds a parameter this state does not know: call state.bind("
                "model.named_parameters()) after unpickling, and register the state with the "
                "DDP model it was made for"
            ) from None

    def config_digest(self) -> dict[str, str]:
        """What every rank must agree on: algorithm, plan and options, as hex digests (with a
        ``params_schedule``, of the first parameters: the schedule is among the options)."""
        self._ready()
        alg_digest, plan_digest = self._base_digests
        return config_digest(
            alg_digest, plan_digest, self.seed, self.check_finite, self.warmup_steps,
            self.params_schedule,
        )  # fmt: skip

    def _apply_params(self, params: dict[str, Any]) -> None:
        """Switch to the algorithm with ``params`` (between steps), keeping every state."""
        if self._spec is None:  # (a schedule needs an algorithm given by name)
            return
        name, current, backend = self._spec
        if params == current:
            return
        alg = resolve_algorithm(name, params, backend)
        build_kernels(alg, self._devices.values())
        self._spec = (name, params, backend)
        self.algorithm = alg
        self.plan = dataclasses.replace(self.plan, params=dict(alg.params))
        self._relayout()  # payload sizes may differ: new layouts and buffers
        self._ctx.algorithm = alg
        self._engine.relayout(self._layout)
        logger.info(
            "casync: step %d: %s parameters now %s", self._engine.step, name, dict(alg.params)
        )

    def _after_step(self, step: int) -> None:
        """The engine finished a step: switch parameters where the schedule says."""
        if self.params_schedule:
            self._apply_params(params_at(self._base_params, self.params_schedule, step))

    # ---- synchronisation --------------------------------------------------------------------

    def submit(
        self, buffer: torch.Tensor, names: Sequence[str], last: bool
    ) -> torch.futures.Future[torch.Tensor]:
        """Start synchronising a flat ``buffer`` holding the gradients of parameters ``names``
        (in order); ``last`` marks the step's last bucket. Every rank must submit the same
        layouts in the same order. Returns a future completing with ``buffer``, averaged.

        Raises :class:`ConfigMismatchError` at the first call if ranks disagree, and
        :class:`CommError` if that check or a collective of an earlier bucket of this step
        failed (a peer died or stalled past the process group's timeout).
        """
        with self._lock:
            self._ready()  # (binds and plans at the first call, where that is still to do)
            self._engine.open_step()
            if not self._agreed:
                self._agree(buffer.device)
            return self._engine.submit(buffer, names, last, self.process_group)

    def _agree(self, device: torch.device) -> None:
        """The first step's check that every rank runs the same configuration."""
        note = describe(self.algorithm, self.plan, self.seed, self.check_finite, self.warmup_steps)
        try:
            check_agreement(self.config_digest(), note, self.world_size, self.process_group,
                            device)  # fmt: skip
        except CaSyncError:
            raise
        except Exception as exc:  # gloo/NCCL error: a peer died or timed out
            raise CommError(
                "CaSync: the first step's configuration check failed (a peer may have "
                "exited or stalled past the process group's timeout; see the other "
                f"ranks' logs): {exc}"
            ) from exc
        self._agreed = True

    @property
    def tracer(self) -> Tracer:
        """The :class:`~hipress.casync.trace.Tracer` of this rank's steps (add your own
        phases with ``state.tracer.span("forward", "compute")``)."""
        return self.stats.tracer

    def trace(self, path: str | os.PathLike[str] | None = None, steps: int | None = 10) -> Tracer:
        """Record a timeline of the next ``steps`` steps and write it to ``path`` (one
        Chrome trace-event JSON file per rank: ``{rank}`` in ``path`` is filled in, else
        ``-rank<r>`` is added; a directory gets ``trace-rank<r>.json``) when the last one
        ends; ``path=None`` keeps the spans in memory (:meth:`Tracer.events
        <hipress.casync.trace.Tracer.events>`). ``hipress trace FILES`` prints the
        breakdown and renders a PNG. Returns the tracer."""
        self.stats.tracer.record(path, steps, algorithm=getattr(self.algorithm, "name", "?"))
        return self.stats.tracer

    def close(self) -> None:
        """End the state's ring thread (also done when the state is collected). A closed
        state cannot run ring rounds any more."""
        if self._plan is not None:
            self._ctx.ring.close()

    def watch_unused(self, ddp_model: DistributedDataParallel) -> None:
        """Keep error feedback whole under ``find_unused_parameters=True``: the states of a
        parameter no rank used in a step are restored after it, as if it had not been
        synchronised (DDP leaves its gradient untouched). :func:`register` calls this."""
        self._unused_model = ddp_model
        if self._plan is None:  # (applied when the plan is made)
            return
        engine = self._engine
        if engine.unused is not None:
            engine.unused.remove()
        named = [(self._param_names[id(p)], p) for p in ddp_model.module.parameters()
                 if id(p) in self._param_names]  # fmt: skip
        engine.unused = UnusedGuard(ddp_model, named, (self.worker_states, self.server_states))


def _devices(
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
