"""``DistributedOptimizer``: a drop-in for ``hvd.DistributedOptimizer`` that compresses.

Like Horovod, the wrapper class is built with ``type(...)`` around the user's optimizer class
(so ``isinstance(opt, torch.optim.SGD)`` holds and ``step`` is the user's), from a mixin whose
methods come first. Triggering follows Horovod: a post-accumulate-grad hook per parameter starts
its synchronisation once ``backward_passes_per_step`` backward passes have accumulated into
``.grad``; ``synchronize()`` (called by ``step()``) starts the parameters whose hook did not fire,
waits for everything and writes the averaged gradients into ``.grad``.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from hipress.codec.algorithm import build_kernels, resolve_algorithm
from hipress.codec.errors import CaSyncError
from hipress.codec.planning import DEFAULT_ALGORITHM, keep_plain, resolve_plan
from hipress.codec.rowplan import embedding_rows
from hipress.codec.rowsparse import build_row_kernels
from hipress.core.compression import CompressionAlgorithm, compresses
from hipress.core.plan import Plan, PlanError, Strategy
from hipress.core.rule import DefaultRule, Selection, Shapes
from hipress.horovod.comm import HorovodComm
from hipress.horovod.errors import HorovodSyncError, import_horovod
from hipress.horovod.sync import HorovodSync, Pending
from hipress.secopa.measure.runtime import auto_plan
from hipress.secopa.model.planner import PlannerConfig

__all__ = ["DistributedOptimizer"]

_FORMAT = "hipress.horovod/1"
log = logging.getLogger(__name__)


class _HiPressOptimizerMixin:
    """Methods copied into the generated class (``self`` is also a ``torch.optim.Optimizer``)."""

    param_groups: list[dict[str, Any]]

    def __init__(
        self,
        params: Any,
        names: dict[torch.Tensor, str],
        sync: HorovodSync,
        backward_passes_per_step: int,
        sparse_as_dense: bool,
    ) -> None:
        super(self.__class__, self).__init__(params)  # type: ignore[misc, call-arg]
        self._hipress_names = names
        self._hipress_sync = sync
        self.backward_passes_per_step = backward_passes_per_step
        self._sparse_as_dense = sparse_as_dense
        self._requires_update = [
            p for g in self.param_groups for p in g["params"] if p.requires_grad
        ]
        self._delay = {p: backward_passes_per_step for p in self._requires_update}
        self._pending: dict[torch.Tensor, Pending] = {}
        self._synchronized = False
        self._should_synchronize = True
        self._hook_handles = [
            p.register_post_accumulate_grad_hook(self._hipress_hook) for p in self._requires_update
        ]

    # ---- Horovod's optimizer surface ----------------------------------------------------------

    @property
    def hipress_sync(self) -> HorovodSync:
        """The transport: algorithm, resolved ``plan``, ``worker_states``/``server_states``."""
        return self._hipress_sync

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Change how many backward passes accumulate before a gradient is synchronised."""
        if passes < 1:
            raise ValueError(f"backward_passes_per_step must be >= 1, got {passes}")
        self.backward_passes_per_step = passes
        for p in self._delay:
            self._delay[p] = passes

    def _grad_of(self, p: torch.Tensor) -> torch.Tensor:
        if p.grad is None:  # another rank may have a gradient for it (dynamic graphs)
            p.grad = torch.zeros_like(p)
        grad = p.grad
        if grad.is_sparse:
            if not self._sparse_as_dense:
                raise HorovodSyncError(
                    f"{self._hipress_names[p]} has a sparse gradient; pass sparse_as_dense=True"
                )
            grad = grad.to_dense()
        return grad

    def _start(self, p: torch.Tensor) -> None:
        self._pending[p] = self._hipress_sync.start(self._hipress_names[p], self._grad_of(p))

    def _hipress_hook(self, p: torch.Tensor) -> None:
        if p in self._pending:
            raise HorovodSyncError(
                f"gradient of {self._hipress_names[p]} was computed more than "
                f"backward_passes_per_step={self.backward_passes_per_step} times before step(); "
                "raise backward_passes_per_step or call step() / synchronize() more often"
            )
        self._delay[p] -= 1
        if self._delay[p] == 0:
            self._start(p)

    def synchronize(self) -> None:
        """Start every parameter not started yet, wait for all, and write the averaged
        gradients into ``.grad``. Every rank must call it the same number of times."""
        for p in self._requires_update:
            if p not in self._pending:
                self._start(p)
        sync = self._hipress_sync
        for pending in self._pending.values():
            sync.advance(pending)
        for p, pending in self._pending.items():
            out = sync.finish(pending)
            assert p.grad is not None
            if p.grad.is_sparse:
                p.grad.zero_().add_(out.to_sparse())
            else:
                p.grad.copy_(out)
            self._delay[p] = self.backward_passes_per_step
        self._pending.clear()
        self._synchronized = True
        sync.end_step()  # (while embeddings' rows are counted: may decide which go as rows)

    @contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Within this context, ``step()`` does not synchronise (call ``synchronize()`` first)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure: Any = None) -> Any:
        """Synchronise (unless inside :meth:`skip_synchronize`), then the wrapped step."""
        if self._should_synchronize:
            if self._synchronized:
                # as Horovod warns; here a second synchronisation also re-compresses the
                # already averaged gradients and advances the error-feedback states
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() after "
                    "optimizer.synchronize(): gradients are synchronised (and compressed) "
                    "again; wrap step() in `with optimizer.skip_synchronize():`",
                    stacklevel=2,
                )
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)  # type: ignore[misc]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The wrapped ``zero_grad``; refused while synchronisations are in flight."""
        if self._pending:
            raise HorovodSyncError(
                "zero_grad() was called after backward() but before step() or synchronize(); "
                "gradients are still being synchronised"
            )
        super(self.__class__, self).zero_grad(set_to_none=set_to_none)  # type: ignore[misc]

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """The wrapped ``load_state_dict``; also resets the backward-pass counters."""
        super(self.__class__, self).load_state_dict(state_dict)  # type: ignore[misc]
        for p in self._delay:
            self._delay[p] = self.backward_passes_per_step

    # ---- compression state (per rank) ---------------------------------------------------------

    def compression_state_dict(self) -> dict[str, Any]:
        """This rank's algorithm states (error feedback, momentum, RNG counters), CPU copies,
        and the row decision (which embeddings travel as rows, and the counts behind it).

        Kept apart from ``state_dict()`` because it differs per rank, while the optimizer state
        is the same on every rank and ``hvd.broadcast_optimizer_state`` copies it from rank 0.
        Save one per rank and load each into the same rank.
        """
        return self._hipress_sync.state_dict(_FORMAT)

    def load_compression_state_dict(self, sd: Mapping[str, Any]) -> None:
        """Restore :meth:`compression_state_dict` in place, all or nothing. Raises
        :class:`HorovodSyncError` (naming the rank and the entry) if it was saved by another
        rank or world size, or for another algorithm, plan or seed, or is damaged. The
        saved row decision is taken again: the plan runs as it ran when saved."""
        self._hipress_sync.load_state_dict(sd, _FORMAT)


def _names(
    optimizer: torch.optim.Optimizer,
    named_parameters: Iterable[tuple[str, torch.Tensor]] | None,
) -> dict[torch.Tensor, str]:
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if named_parameters is None:
        return {p: f"param.{i}" for i, p in enumerate(params)}
    pairs = list(named_parameters)
    if any(not isinstance(pair, tuple) or len(pair) != 2 for pair in pairs):
        raise ValueError("named_parameters must be a sequence of (name, parameter) pairs")
    names = [n for n, _ in pairs]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"parameter names in named_parameters must be unique, repeated: {dup}")
    by_param = {p: n for n, p in pairs}
    missing = [i for i, p in enumerate(params) if p not in by_param]
    if missing:
        raise ValueError(
            f"named_parameters does not name {len(missing)} of the optimizer's parameters "
            f"(indices {missing[:5]}); pass model.named_parameters() of the optimised model"
        )
    return {p: by_param[p] for p in params}


def _check_unsupported(hvd: Any, op: Any, num_groups: int, groups: Any, process_set: Any) -> None:
    if op is not None and op != hvd.Average:
        what = "Adasum" if op == hvd.Adasum else f"op={op!r}"
        raise HorovodSyncError(
            f"{what} is not supported by hipress.horovod.DistributedOptimizer, which averages "
            "(compressed) gradients; use op=hvd.Average, or hvd.DistributedOptimizer for Adasum"
        )
    if num_groups or groups is not None:
        raise HorovodSyncError(
            "num_groups/groups are not supported: compressed gradients are not fused by Horovod; "
            "leave them unset (Horovod still fuses the uncompressed allreduces)"
        )
    if process_set is not None and process_set is not hvd.global_process_set:
        raise HorovodSyncError("process_set is not supported: hipress synchronises over all ranks")


def _auto_plan(
    hvd: Any,
    alg: CompressionAlgorithm,
    named_numels: list[tuple[str, int]],
    device: torch.device | None,
    select: Selection,
    shaped: list[tuple[str, tuple[int, ...]]],
) -> Plan:
    """SeCoPa's ``plan="auto"`` over Horovod: profile with Horovod's operations on every rank
    (a few seconds), plan on rank 0, broadcast; the same plan on every rank, keeping plain
    what ``select`` keeps plain, as SeCoPa's plan for the DDP hook does. The embeddings kept
    plain are priced as exact rows (their break-even counts, decided by later)."""
    if not compresses(alg):
        raise PlanError("plan='auto' needs a compression algorithm")
    t0 = time.perf_counter()
    # no ring: Horovod has no point-to-point messages
    config = PlannerConfig(strategies=(Strategy.ALLGATHER, Strategy.PS))
    plain = select.reasons(shaped)
    plan = auto_plan(
        alg, named_numels, hvd.size(), comm=HorovodComm(hvd, device), config=config,
        device=device, rows=embedding_rows(select, shaped), plain=plain,
    )  # fmt: skip
    log.info(
        "hipress.horovod: plan='auto' profiled and planned in %.1f s", time.perf_counter() - t0
    )
    return keep_plain(plan, plain)


def _selection(include: Any, exclude: Any, shapes: Any, names: list[str]) -> Selection:
    try:
        select = Selection(include or (), exclude or (), shapes)
        select.check_names(names)
        return select
    except ValueError as exc:
        raise HorovodSyncError(str(exc)) from None


def _check_options(
    backward_passes_per_step: Any, gradient_predivide_factor: Any, seed: Any, rule: Any,
    params: Any,
) -> None:  # fmt: skip
    """``DistributedOptimizer``'s own arguments, each with a message naming it."""
    if (
        isinstance(backward_passes_per_step, bool)
        or not isinstance(backward_passes_per_step, int)
        or backward_passes_per_step < 1
    ):
        raise ValueError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
    if (
        isinstance(gradient_predivide_factor, bool)
        or not isinstance(gradient_predivide_factor, int | float)
        or not 0 < gradient_predivide_factor < float("inf")
    ):
        raise ValueError(
            f"gradient_predivide_factor must be a finite number > 0, got "
            f"{gradient_predivide_factor!r}"
        )
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise HorovodSyncError(f"seed must be an integer >= 0, got {seed!r}")
    if rule is not None and not isinstance(rule, DefaultRule):
        raise HorovodSyncError(f"rule must be a DefaultRule or None, got {rule!r}")
    if params is not None and not isinstance(params, Mapping):
        raise HorovodSyncError(
            f"params must be a dict of the algorithm's parameters, e.g. {{'bitwidth': 2}}, got "
            f"{params!r}"
        )


def DistributedOptimizer(
    optimizer: torch.optim.Optimizer,
    named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
    compression: Any = None,
    backward_passes_per_step: int = 1,
    op: Any = None,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    sparse_as_dense: bool = False,
    process_set: Any = None,
    *,
    algorithm: Any = DEFAULT_ALGORITHM,
    params: Mapping[str, Any] | None = None,
    plan: Plan | str | Path | None = None,
    seed: int = 0,
    backend: str = "auto",
    rule: DefaultRule | None = None,
    include: str | Sequence[str] | None = None,
    exclude: str | Sequence[str] | None = None,
    shapes: Shapes = "all",
) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` so ``step()`` first averages gradients over Horovod, compressing them
    with a CompLL algorithm where the plan says.

    Takes ``hvd.DistributedOptimizer``'s arguments, in its positional order (``compression``
    applies to the uncompressed allreduce entries; ``op`` must be Average; ``num_groups``,
    ``groups`` and ``process_set`` other than the default raise), plus CaSync's, keyword-only:
    ``algorithm`` (CompLL name, algorithm object or
    None), ``params``, ``plan`` (``"default"`` or None for the :class:`DefaultRule` ``rule``,
    ``"auto"``, a plan JSON path or a :class:`~hipress.core.plan.Plan`), ``seed``, ``backend``,
    ``include``/``exclude``/``shapes`` (which parameters may be compressed:
    :class:`~hipress.core.rule.Selection`; with no model here, an embedding is known by its
    name: ``wte``/``wpe``/``*emb*.weight``, 2-D). Call after
    ``hvd.init()``, with the same arguments on every rank. ``plan="auto"`` is SeCoPa's, as in
    the DDP hook: every rank profiles the network with Horovod's operations and the algorithm's
    compute costs (a few seconds), rank 0 plans, and every rank gets rank 0's plan.

    Returns an instance of a class built around ``type(optimizer)`` (its param groups, a fresh
    state). Raises :class:`HorovodNotInstalledError` without Horovod, :class:`HorovodSyncError`
    for unsupported options, CaSync's errors for a bad algorithm, and ``PlanError`` for a plan
    that does not fit, and ``ConfigMismatchError`` (on every rank) if ranks passed different
    algorithms, parameters, plans or seeds.
    """
    hvd = import_horovod()
    _check_unsupported(hvd, op, num_groups, groups, process_set)
    _check_options(backward_passes_per_step, gradient_predivide_factor, seed, rule, params)
    names = _names(optimizer, named_parameters)
    named_numels = [(names[p], p.numel()) for p in names if p.requires_grad]
    shaped = [(names[p], tuple(p.shape)) for p in names if p.requires_grad]
    select = _selection(include, exclude, shapes, [n for n, _ in shaped])
    devices = {names[p]: p.device for p in names if p.requires_grad}
    try:
        alg = resolve_algorithm(algorithm, params, backend)
        build_kernels(alg, devices.values())
        build_row_kernels(shaped, devices)  # (an embedding may travel as rows)
    except CaSyncError as exc:
        raise HorovodSyncError(str(exc)) from exc
    count_rows = plan is None or (isinstance(plan, str) and plan in ("default", "auto"))
    if isinstance(plan, str) and plan == "auto":
        plan = _auto_plan(hvd, alg, named_numels, next(iter(devices.values()), None), select,
                          shaped)  # fmt: skip
    resolved = resolve_plan(plan, alg, named_numels, hvd.size(), rule, selection=select,
                            shapes=shaped)  # fmt: skip
    sync = HorovodSync(
        hvd, alg, resolved, seed, compression, gradient_predivide_factor, devices=devices,
        shapes=dict(shaped), count_rows=count_rows,
    )  # fmt: skip
    sync.check_agreement()
    log.info("hipress.horovod: %s, %d/%d tensors compressed, %d ranks",
             alg.name if compresses(alg) else "no compression",
             sum(e.compress for e in resolved.entries), len(resolved.entries), hvd.size())  # fmt: skip
    mixin = _HiPressOptimizerMixin.__dict__.items()
    body = {k: v for k, v in mixin if k not in ("__dict__", "__weakref__")}
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), body)
    return cls(optimizer.param_groups, names, sync, backward_passes_per_step, sparse_as_dense)
