"""The state of the CaSync DDP hook: :class:`CaSyncState`, one per DDP model and rank.

It checks the configuration eagerly (:mod:`hipress.casync.config`), binds to its process group,
and once it has a plan holds one :class:`~hipress.casync.runtime.Runtime` (chunk layout,
algorithm states, bucket context, step engine), made in one place; checkpoints
(:mod:`hipress.casync.persist`) read and restore it. It hands each bucket to the engine.
"""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from hipress.casync import rounds_plan
from hipress.casync.config import check_options, check_schedule, config_digest, describe, params_at
from hipress.casync.metrics import SyncMetrics
from hipress.casync.planlog import log_adopted
from hipress.casync.probe import StateProbe
from hipress.casync.ready import ReadyProbe
from hipress.casync.rounds_plan import resolve_any
from hipress.casync.rowprobe import RowProbe, decide
from hipress.casync.rowsel import RowSelect
from hipress.casync.runtime import Runtime, build_runtime, state_devices
from hipress.casync.state_io import Checkpoints
from hipress.casync.stats import SyncStats
from hipress.casync.trace import Tracer
from hipress.casync.verdict import PlanCheck, review
from hipress.codec.algorithm import build_kernels, resolve_algorithm
from hipress.codec.errors import CaSyncError, CommError
from hipress.codec.logs import RANK_FILTER
from hipress.codec.planning import DEFAULT_ALGORITHM, check_plan_arg, resolve_plan, rule_plan
from hipress.codec.rowsparse import build_row_kernels
from hipress.compll.rounds import RoundsAlgorithm
from hipress.core.compression import CompressionAlgorithm
from hipress.core.plan import Plan
from hipress.core.rule import DefaultRule, Selection, named_shapes

__all__ = ["CaSyncState"]

logger = logging.getLogger(__name__)
logger.addFilter(RANK_FILTER)

class CaSyncState(Checkpoints, SyncMetrics):
    """State of :func:`~hipress.casync.hook.casync_hook` for one DDP model on one rank.

    Args:
        algorithm: a CompLL algorithm name, an algorithm object, or None for no compression.
        params: the algorithm's hyper-parameters (with a name only).
        named_parameters: (name, parameter) pairs of every parameter that receives a gradient,
            or (name, numel) pairs when there is no model (benchmarks).
        plan: ``"default"`` or None (the default rule), ``"auto"``, a plan file or a Plan.
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
            algorithm (given by name) runs with ``params`` updating the earlier ones, keeping
            every state and the plan, e.g. DGC's warm-up ``[(0, {"s_percent": 0.25}), (500,
            {"s_percent": 0.0625})]``; only parameters that leave the state layout as it is.

    Fields:
        algorithm, seed: as resolved at construction.
        rank, world_size: of the process group, once bound (None before).
        plan: the plan run (a property: see below).
        stats: :class:`~hipress.casync.stats.SyncStats` of this rank.
        worker_states, server_states: per-chunk algorithm states (error feedback, momentum),
            made with the plan (properties, like ``plan``).
        comm_error: the :class:`CommError` a collective of this state raised, else None.

    Everything after ``algorithm`` is keyword-only, and checked here: a bad option, algorithm or
    plan file raises before training starts. ``selection``: which tensors stay plain
    (:class:`~hipress.core.rule.Selection`); ``fallback``: run the plain plan where compression
    loses (:mod:`~hipress.casync.verdict`; None: for ``plan="auto"`` only). With the default rule
    or ``"auto"``, embeddings travel as rows where that pays (:mod:`~hipress.casync.rowprobe`);
    ``rows`` says otherwise (``"none"``, ``"exact"`` or parameter names,
    :mod:`~hipress.casync.rowsel`).
    The state binds to its process group at construction if ``torch.distributed`` is
    initialised, else at its first use (so it can be made before ``init_process_group``, e.g.
    for Lightning's ``DDPStrategy(ddp_comm_state=...)``; a plan that does not fit the world
    size raises then). ``plan="auto"`` plans at the first step (every rank takes part), unless
    :meth:`load_state_dict` brought a checkpoint's plan first; with ``ready_steps=N`` it
    synchronises the first N steps uncompressed while timing when each gradient is ready,
    then plans with those times (:mod:`hipress.casync.ready`). The state pickles without its
    process group, binding, buffers and in-flight work: :meth:`bind` it and register it again.
    """

    def __init__(
        self,
        algorithm: str | CompressionAlgorithm | None = DEFAULT_ALGORITHM,
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
        selection: Selection | None = None,
        fallback: bool | None = None,
        ready_steps: int = 0,
        rows: Any = "auto",
    ) -> None:
        check_options(params, seed, rule, check_finite, log_every, warmup_steps, plan)
        named = list(named_parameters)
        if not named:
            raise CaSyncError("the model has no parameter that requires a gradient")
        self._numels = [(n, int(p) if isinstance(p, int) else p.numel()) for n, p in named]
        self._select, self._shapes = selection, named_shapes(named)
        if selection is not None:
            try:
                selection.check_names(n for n, _ in named)
            except ValueError as exc:
                raise CaSyncError(str(exc)) from None
        self._devices, self._trained_on = state_devices(named, device)
        self.process_group = process_group
        self.rank: int | None = None
        self.world_size: int | None = None
        name = algorithm if isinstance(algorithm, str) else None
        self._spec = (name, dict(params or {}), backend) if name is not None else None
        self.algorithm = resolve_any(algorithm, params, backend)
        self._multi = isinstance(self.algorithm, RoundsAlgorithm)  # (hipress.casync.rounds_plan)
        if self._multi:
            rounds_plan.check_options(self.algorithm, plan, fallback, params_schedule,
                                      dict(self._shapes))  # fmt: skip
        schedule = check_schedule(params_schedule, name, params, self.algorithm)
        build_kernels(self.algorithm, self._devices.values())
        build_row_kernels(self._shapes, self._devices)  # a gradient may travel as rows
        self._plan_arg = check_plan_arg(plan, self.algorithm)
        self._ready = ReadyProbe.of(self._plan_arg, self._multi, named, ready_steps)
        start = self._ready.start(warmup_steps)
        self._check = PlanCheck.of(self._plan_arg, fallback, start)
        self._rows = RowProbe.of(self._plan_arg, start)  # (embeddings as rows)
        self._rowsel = RowSelect.of(rows, self._plan_arg, self._multi, dict(self._shapes))
        self._rows.enabled &= not self._rowsel.never
        self._rule = rule
        self.seed = int(seed)
        self.check_finite = bool(check_finite)
        self.warmup_steps = warmup_steps
        self.params_schedule = schedule
        self._base_params = dict(params or {})
        self.stats = SyncStats(log_every=log_every)
        self._rt: Runtime | None = None
        self._init_local()
        self.bind(named)
        if dist.is_initialized():
            self._attach()

    def _init_local(self) -> None:
        """What does not pickle and exists before the plan: the binding, the lock, the error."""
        self.comm_error: CommError | None = None
        self._param_names: dict[int, str] = {}
        self._lock = threading.Lock()
        self._unused_model: DistributedDataParallel | None = None

    @property
    def plan(self) -> Plan:
        """The plan this state runs. With ``plan="auto"``, reading it before the first step (or
        a :meth:`load_state_dict` that brings one) makes it now: every rank must read it."""
        return self._runtime().plan

    @plan.setter
    def plan(self, plan: Plan) -> None:
        self._runtime().plan = plan

    def wire_nbytes(self) -> dict[str, int] | None:
        """Each tensor's bytes per step as this state sends them (its payload where compressed,
        else its gradient's: for exact rows, the most they can be) under its plan; where
        ``plan="auto"`` has not planned yet, under the default rule (an estimate). None for a
        multi-round algorithm (PowerSGD), whose bytes depend on each tensor's shape and rank."""
        if self._multi:
            return None
        plan = self._rt.plan if self._rt is not None else rule_plan(
            self.algorithm, self._numels, self.world_size or 1, self._rule, self._select,
            self._shapes)  # fmt: skip
        return {e.name: self.algorithm.payload_nbytes(e.numel) if e.compress else 4 * e.numel
                for e in plan.entries}  # fmt: skip

    @property
    def multi_round(self) -> bool:
        """Whether the algorithm is a multi-round one (PowerSGD): see
        :mod:`hipress.casync.rounds_plan`."""
        return self._multi

    @property
    def worker_states(self) -> dict[str, Any]:
        """This rank's worker states by chunk key (made with the plan, like :attr:`plan`)."""
        return self._runtime().worker_states

    @property
    def server_states(self) -> dict[str, Any]:
        """This rank's server states by chunk key (made with the plan, like :attr:`plan`)."""
        return self._runtime().server_states

    def _attach(self) -> None:
        """Bind to the process group: rank, world size, and the plan unless ``"auto"``."""
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
            self._adopt(self._plan_arg)

    def _runtime(self) -> Runtime:
        """The runtime, bound and planned first where still to do (``"auto"``: a collective)."""
        self._attach()
        return self._rt if self._rt is not None else self._adopt("auto")

    def _adopt(self, plan: Plan | str | Path | None) -> Runtime:
        """Resolve ``plan`` (checked) and run it: its runtime, with all-zero states."""
        assert self.rank is not None and self.world_size is not None
        stand_in = self._ready.waiting(plan)  # ("auto": the default plan, uncompressed, first)
        if self._multi:
            resolved = self._rounds_plan(plan)
        else:
            resolved = resolve_plan(
                None if stand_in else plan, self.algorithm, self._numels, self.world_size,
                self._rule, group=self.process_group, device=self._trained_on,
                probe=StateProbe(type(self)), selection=self._select, shapes=self._shapes,
                readiness=self._ready.readiness,
            )  # fmt: skip
        resolved = self._rowsel.prepare(resolved, dict(self._shapes), self._rows)
        config = config_digest(
            self.algorithm.digest, resolved.digest(), self.seed, self.check_finite,
            self.warmup_steps, self.params_schedule,
        )  # fmt: skip
        rt = self._make_runtime(resolved, resolved, config)
        self._ready.started(rt, stand_in)
        self._after_step(0)  # (the schedule's parameters at step 0)
        log_adopted(logger, resolved, plan, self._rule, self.world_size,
                    probe=getattr(self, "probe", False))  # (a probe: see StateProbe)
        return rt

    def _rounds_plan(self, plan: Plan | str | Path | None) -> Plan:
        """A multi-round algorithm's plan: the default split, SeCoPa's (``"auto"``), or
        ``plan`` checked."""
        assert self.world_size is not None
        shapes = dict(self._shapes)
        if isinstance(plan, Plan):
            return rounds_plan.check_plan(plan, self.algorithm, self._numels, shapes,
                                          self.world_size)  # fmt: skip
        if isinstance(plan, str) and plan == "auto":  # (SeCoPa prices the rounds)
            made = rounds_plan.auto_plan(self.algorithm, self._numels, shapes, self._select,
                                         self.process_group, self._trained_on)  # fmt: skip
        else:
            made = rounds_plan.make_plan(self.algorithm, self._numels, shapes,
                                         self.world_size, self._select)  # fmt: skip
        self._rows.rows = rounds_plan.row_candidates(made, shapes)
        return made

    def _make_runtime(self, plan: Plan, base_plan: Plan, config: dict[str, str],
                      states: tuple[dict[str, Any], dict[str, Any]] | None = None) -> Runtime:  # fmt: skip
        """The one place a runtime is made (a new plan's, or an unpickled state's)."""
        assert self.rank is not None and self.world_size is not None
        self._rt = build_runtime(
            self.algorithm, plan, rank=self.rank, world_size=self.world_size, seed=self.seed,
            devices=self._devices, stats=self.stats, check_finite=self.check_finite,
            warmup_steps=self.warmup_steps, config=config, on_step_end=self._after_step,
            base_plan=base_plan, states=states, shapes=dict(self._shapes),
        )  # fmt: skip
        if self._unused_model is not None:
            self.watch_unused(self._unused_model)
        return self._rt

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
        """What every rank must agree on (algorithm, plan, options) as hex digests; with a
        schedule, the first parameters' (the schedule is among the options)."""
        return dict(self._runtime().config)

    def _after_step(self, step: int) -> None:
        """The engine finished a step (or a plan or checkpoint starts at ``step``): switch to
        the schedule's parameters of ``step``, keeping every state."""
        if not self.params_schedule or self._spec is None or self._rt is None:
            return
        name, current, backend = self._spec
        params = params_at(self._base_params, self.params_schedule, step)
        if params == current:
            return
        alg = resolve_algorithm(name, params, backend)
        build_kernels(alg, self._devices.values())
        self._spec = (name, params, backend)
        self.algorithm = alg
        self._rt.switch(alg)  # payload sizes may differ: new layouts and buffers
        logger.info("casync: step %d: %s parameters now %s", step, name, dict(alg.params))

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
            rt = self._runtime()  # (binds and plans at the first call, where still to do)
            if not rt.engine.open and self._ready.due(rt):
                rt = self._ready.adopt(self, rt, buffer.device)  # ("auto", with ready times)
            if not rt.engine.open and self._rows.due(rt.engine.step):
                decider = rounds_plan.decide_rows if self._multi else decide
                rt = decider(self, rt, buffer.device)  # (embeddings as rows, where that pays)
            if not rt.engine.open and self._check.due(rt.engine.step, rt.plan):
                rt = review(self, rt, buffer.device)  # (the plain plan, where compression loses)
            rt.engine.open_step()
            try:
                if not rt.agreed:  # (the first step: every rank runs the same configuration)
                    note = describe(self.algorithm, rt.plan, self.seed, self.check_finite,
                                    self.warmup_steps)  # fmt: skip
                    rt.agree(note, self.process_group, buffer.device)
                self._rows.observe(self, rt, buffer, names)
                return self._ready.submit(rt, buffer, names, last, self.process_group)
            except CommError as exc:
                self.comm_error = exc
                raise

    @property
    def tracer(self) -> Tracer:
        """The :class:`~hipress.casync.trace.Tracer` of this rank's steps (add your own
        phases with ``state.tracer.span("forward", "compute")``)."""
        return self.stats.tracer

    def trace(self, path: str | os.PathLike[str] | None = None, steps: int | None = 10) -> Tracer:
        """Record a timeline of the next ``steps`` steps and write it to ``path`` (one Chrome
        trace-event JSON file per rank: ``{rank}`` in ``path`` is filled in, else ``-rank<r>``
        is added; a directory gets ``trace-rank<r>.json``) when the last one ends; ``None``
        keeps the spans in memory (:meth:`Tracer.events <hipress.casync.trace.Tracer.events>`).
        ``hipress trace FILES`` prints the breakdown and renders a PNG. Returns the tracer."""
        self.stats.tracer.record(path, steps, algorithm=getattr(self.algorithm, "name", "?"))
        return self.stats.tracer

    def close(self) -> None:
        """End the state's ring thread (also done when it is collected): no ring rounds after."""
        if self._rt is not None:
            self._rt.ctx.ring.close()

    def watch_unused(self, ddp_model: DistributedDataParallel) -> None:
        """Keep error feedback whole under ``find_unused_parameters=True``: the states of a
        parameter no rank used in a step are restored after it, as if it had not been
        synchronised (DDP leaves its gradient untouched). :func:`register` calls this."""
        self._unused_model = ddp_model
        rt = self._rt
        if rt is None:  # (applied when the plan is made)
            return
        rt.watch_unused(ddp_model, self._param_names)
