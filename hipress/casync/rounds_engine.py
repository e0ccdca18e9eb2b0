"""The step engine of a CaSync state running a multi-round algorithm: :class:`RoundsEngine`.

It keeps :class:`~hipress.casync.engine.StepEngine`'s step (warm-up steps as DDP's own
all-reduce, the step count, the unused-parameter guard) and runs each bucket as its plan says
(:mod:`hipress.casync.rounds_plan`): the tensors of ``strategy: rounds`` and the plain ones
through a :class:`~hipress.casync.rounds_hook.RoundsRunner` (the same machinery, in the same
order, as :func:`~hipress.casync.rounds_hook.register_rounds`), the row-sparse ones through a
:class:`~hipress.casync.strategies.op.BucketOp` of those entries alone
(:mod:`~hipress.casync.strategies.rowsparse`), which advances with the bucket's rounds. Every
collective is issued on the hook's thread, in the same order on every rank; each is counted
and traced (``issue``/``comm`` spans, ``encode``/``decode`` phases).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from hipress.casync.bulk import BucketSchedule, Workspace
from hipress.casync.clock import Lap
from hipress.casync.engine import StepEngine
from hipress.casync.rounds_hook import RoundsRunner
from hipress.casync.strategies.context import SyncContext
from hipress.casync.strategies.op import BucketOp
from hipress.casync.trace import NETWORK_LANE
from hipress.codec.errors import CaSyncError, CommError
from hipress.compll.rounds import RoundsAlgorithm
from hipress.core.layout import PlanLayout
from hipress.core.plan import Strategy

__all__ = ["RoundsEngine", "rounds_key"]


def rounds_key(name: str) -> str:
    """The worker-state key of a tensor's multi-round algorithm state."""
    return f"{name}#rounds"


class RoundsEngine(StepEngine):
    """Runs the steps of a multi-round CaSync state (see the module docstring)."""

    def __init__(self, ctx: SyncContext, layout: PlanLayout, warmup_steps: int,
                 on_step_end: Callable[[int], None], algorithm: RoundsAlgorithm,
                 plan: Any, shapes: Mapping[str, Any]) -> None:  # fmt: skip
        super().__init__(ctx, layout, warmup_steps, on_step_end)
        self._decisions = {e.name: e for e in plan.entries}
        self.shapes = {n: tuple(s) for n, s in shapes.items() if s is not None}
        self.algorithm = algorithm
        self._group: Any = None
        self.runner = RoundsRunner(algorithm, None, ctx.world_size, self._issue, ctx.stats.timed)
        self._rows: dict[tuple[Any, ...], tuple[BucketSchedule, Workspace]] = {}

    def relayout(self, layout: PlanLayout) -> None:
        raise CaSyncError("a multi-round algorithm keeps its parameters: no schedule")

    def _issue(self, what: str, launch: Callable[[], Any], nbytes: int) -> Any:
        """Issue one collective, counted and traced as BucketOp's are."""
        stats, tracer = self.ctx.stats, self.ctx.stats.tracer
        start = stats.clock.mark()
        with tracer.span("issue", "issue", what=what):
            work = launch()
        end = stats.clock.after([work])
        stats.add(collectives=1, bytes_sent=nbytes)

        def arrived(_: Any) -> None:
            lap = Lap(start, end if end is not None else stats.clock.mark())
            stats.add_lap("comm_ms", lap)
            tracer.lap(what, "comm", lap, lane=NETWORK_LANE, bytes=nbytes)

        work.get_future().add_done_callback(arrived)
        return work

    def _rows_op(self, buffer: torch.Tensor, names: Sequence[str],
                 sparse: list[tuple[int, Any]]) -> BucketOp:  # fmt: skip
        """The row-sparse part of a bucket: a BucketOp of its row entries alone."""
        key = (tuple(names), buffer.dtype, buffer.device)
        hit = self._rows.get(key)
        if hit is None:
            schedule = BucketSchedule(tuple(names), buffer.numel(), (), (), tuple(sparse))
            hit = self._rows[key] = (schedule, Workspace(schedule, self.ctx.world_size,
                                                         buffer.device, buffer.dtype))  # fmt: skip
        return BucketOp(self.ctx, hit[0], hit[1], buffer)

    def _submit(self, buffer: torch.Tensor, names: Sequence[str], last: bool,
                group: dist.ProcessGroup | None) -> torch.futures.Future[torch.Tensor]:  # fmt: skip
        if self.step < self.warmup_steps:
            return self._submit_warm(buffer, last, group)
        runner, stats = self.runner, self.ctx.stats
        runner.group = group
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        try:
            runner.step(False)
            stats.bucket_submitted(last, buffer.device)
            if self.unused is not None:
                self.unused.before_encode(names)
            grads, states, plain, sparse = self._split(buffer, names)
            others = []
            if sparse:
                op = self._rows_op(buffer, names, sparse)
                op.start(group)
                others.append(op)
            else:
                stats.add(bytes_uncompressed=buffer.numel() * buffer.element_size())
                fut.add_done_callback(lambda _: stats.bucket_finished())
            runner.begin(buffer, fut, grads, states, plain, others)
            if last:
                with stats.tracer.span("wait", "wait", what="step's buckets"):
                    runner.step(True)
        except BaseException as exc:
            err = self._fail(exc)
            raise err from exc
        if last:
            self.end_step()
        return fut

    def _split(self, buffer: torch.Tensor, names: Sequence[str]) -> tuple[
            list[torch.Tensor], list[Any], list[torch.Tensor], list[tuple[int, Any]]]:  # fmt: skip
        """The bucket's tensors by plan: rounds (with their states), plain, rows."""
        grads, states, plain, sparse = [], [], [], []
        offset, shapes = 0, self.shapes
        for name in names:
            e = self._decisions[name]
            view = buffer[offset : offset + e.numel]
            if e.row_bound:
                sparse.append((offset, e))
            elif e.strategy is Strategy.ROUNDS:
                grads.append(view.view(shapes[name]))
                states.append(self.ctx.worker_states[rounds_key(name)])
            else:
                plain.append(view)
            offset += e.numel
        return grads, states, plain, sparse

    def _fail(self, exc: BaseException) -> CaSyncError:
        """Fail every bucket in flight (no future left waiting), let nothing issued stay
        pending, and return the error to raise."""
        err = exc if isinstance(exc, CaSyncError) else CommError(
            f"CaSync: {self.algorithm.name}'s rounds failed (a peer may have exited or stalled "
            f"past the process group's timeout; see the other ranks' logs): {exc}")  # fmt: skip
        for fl in self.runner.flights:
            for o in fl.others:
                o.fail(err)
                o.drain()
            for w in fl.works:
                with contextlib.suppress(Exception):
                    w.wait()
            if not fl.future.done():
                fl.future.set_exception(err)
        self.runner.flights = []
        self.ctx.stats.abandon_step()
        return err
