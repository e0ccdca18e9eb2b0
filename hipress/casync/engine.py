"""The step engine of one CaSync state: buckets in, futures out.

:class:`StepEngine` turns each bucket a DDP hook submits into a
:class:`~hipress.casync.strategies.BucketOp` and keeps the step's order: the bucket layouts
(one :class:`~hipress.casync.bulk.BucketSchedule` and :class:`~hipress.casync.bulk.Workspace`
per layout, built once from the plan's :class:`~hipress.core.layout.PlanLayout` and freed
when DDP rebuilds its buckets), the PS second phases issued from the next bucket's call, the
warm-up steps (DDP's own allreduce) and the step count. It holds no process group: the state
passes it to :meth:`StepEngine.submit`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from hipress.casync.bulk import BucketSchedule, Workspace, schedule_bucket
from hipress.casync.clock import Lap
from hipress.casync.strategies.context import SyncContext
from hipress.casync.strategies.op import BucketOp
from hipress.casync.trace import NETWORK_LANE
from hipress.casync.unused import UnusedGuard
from hipress.codec.errors import CaSyncError, CommError
from hipress.codec.logs import RANK_FILTER
from hipress.core.layout import PlanLayout

__all__ = ["StepEngine"]

logger = logging.getLogger(__name__)
logger.addFilter(RANK_FILTER)


def _as_error(exc: BaseException) -> CaSyncError:
    return exc if isinstance(exc, CaSyncError) else CaSyncError(f"CaSync: {exc}")


class StepEngine:
    """Runs the steps of one CaSync state (see the module docstring).

    Args:
        ctx: what every bucket operation shares (algorithm, chunk states, stats, ring).
        layout: the plan's chunks for the current algorithm (:meth:`relayout` replaces it).
        warmup_steps: steps synchronised uncompressed first.
        on_step_end: called with the new step count after each step (the parameter schedule).

    Fields:
        step: the steps completed (kept in checkpoints).
        unused: the guard of ``find_unused_parameters`` models, if any.
        open: whether a step's first bucket was submitted and its last one not yet.
    """

    def __init__(
        self,
        ctx: SyncContext,
        layout: PlanLayout,
        warmup_steps: int,
        on_step_end: Callable[[int], None],
    ) -> None:
        self.ctx = ctx
        self.layout = layout
        self.warmup_steps = warmup_steps
        self.on_step_end = on_step_end
        self.step = 0
        self.unused: UnusedGuard | None = None
        self.open = False
        self._decisions = {e.name: e for e in layout.plan.entries}
        self._cache: dict[tuple[Any, ...], tuple[BucketSchedule, Workspace, int]] = {}
        self._pending: list[BucketOp] = []
        self._inflight: list[BucketOp] = []  # this step's buckets
        # this warm-up step's buckets: each future and the allreduce under it
        self._warm: list[tuple[torch.futures.Future[torch.Tensor], Any]] = []

    def relayout(self, layout: PlanLayout) -> None:
        """Use ``layout`` from now on (between steps: payload sizes may differ); frees every
        bucket layout built so far."""
        self.layout = layout
        self._cache.clear()

    def open_step(self) -> None:
        """Mark the step open at its first bucket (the unused-parameter guard starts then)."""
        if not self.open:
            self.open = True
            self.ctx.stats.tracer.step_opened()
            if self.unused is not None:
                self.unused.step_open()

    def _schedule(
        self, names: Sequence[str], buffer: torch.Tensor
    ) -> tuple[BucketSchedule, Workspace]:
        """The schedule and buffers of this bucket layout, built at its first use."""
        key = (tuple(names), buffer.dtype, buffer.device)
        hit = self._cache.get(key)
        if hit is None:
            decisions = [self._decisions[n] for n in names]
            numels = [d.numel for d in decisions]
            schedule = schedule_bucket(names, numels, decisions, self.layout.chunks)
            workspace = Workspace(schedule, self.ctx.world_size, buffer.device, buffer.dtype)
            logger.debug(
                "casync: new bucket layout of %d tensors, %d rounds",
                len(names),
                len(schedule.rounds),
            )
            hit = (schedule, workspace, self.step)
        self._cache[key] = (hit[0], hit[1], self.step)
        return hit[0], hit[1]

    def submit(
        self,
        buffer: torch.Tensor,
        names: Sequence[str],
        last: bool,
        group: dist.ProcessGroup | None,
    ) -> torch.futures.Future[torch.Tensor]:
        """Start synchronising ``buffer`` (the gradients of ``names``) over ``group``; ``last``
        marks the step's last bucket. Returns a future completing with ``buffer``, averaged.
        Raises :class:`CaSyncError` (:class:`CommError` for a failed collective) after failing
        every bucket of the step."""
        with self.ctx.stats.tracer.span("hook", "hook", tensors=len(names), last=last):
            return self._submit(buffer, names, last, group)

    def _submit(
        self,
        buffer: torch.Tensor,
        names: Sequence[str],
        last: bool,
        group: dist.ProcessGroup | None,
    ) -> torch.futures.Future[torch.Tensor]:
        if self.step < self.warmup_steps:
            return self._submit_warm(buffer, last, group)
        earlier, self._pending = self._pending, []
        op: BucketOp | None = None
        try:
            schedule, workspace = self._schedule(names, buffer)
            self.ctx.stats.bucket_submitted(last, buffer.device)
            if self.unused is not None:
                self.unused.before_encode(names)
            op = BucketOp(self.ctx, schedule, workspace, buffer)
            self._inflight.append(op)
            op.start(group)
            for other in earlier:
                other.advance(group)
            if last:
                op.advance(group)
                # DDP waits for every bucket right after this call anyway; waiting here
                # raises a failure as the CaSyncError it is (DDP cannot unwrap a future
                # that a completion callback or the ring thread failed)
                with self.ctx.stats.tracer.span("wait", "wait", what="step's buckets"):
                    for other in self._inflight:
                        other.future.wait()
                    for other in self._inflight:
                        other.settle()
            elif op.deferred:
                self._pending.append(op)
        except BaseException as exc:
            # fail every bucket of the step, so no future is left waiting forever, and let
            # nothing it issued stay pending (see BucketOp.drain)
            err = op.fail(exc) if op is not None else _as_error(exc)
            for other in self._inflight:
                other.fail(err)
            for other in self._inflight:
                other.drain()
            self._inflight = []
            self.ctx.stats.abandon_step()
            raise err from exc
        if last:
            self._inflight = []
            self.end_step()
        return op.future

    def _submit_warm(
        self, buffer: torch.Tensor, last: bool, group: dist.ProcessGroup | None
    ) -> torch.futures.Future[torch.Tensor]:
        """A warm-up step's bucket; the last one waits for the step's allreduces."""
        fut, work = self._allreduce_bucket(buffer, last, group)
        self._warm.append((fut, work))
        if last:
            warm, self._warm = self._warm, []
            self.end_step()
            for f, w in warm:  # raise a failure as the CommError it is (see submit)
                try:
                    with self.ctx.stats.tracer.span("wait", "wait", what="warm-up allreduce"):
                        f.wait()
                        w.wait()  # ended on the backend's thread too (see BucketOp.settle)
                except Exception as exc:
                    cause = exc.__cause__ or exc
                    msg = str(cause).split("CommError: ", 1)[-1]
                    raise CommError(msg if "CaSync" in msg else f"CaSync: {msg}") from exc
        return fut

    def _allreduce_bucket(
        self, buffer: torch.Tensor, last: bool, group: dist.ProcessGroup | None
    ) -> tuple[torch.futures.Future[torch.Tensor], Any]:
        """A warm-up step's bucket: DDP's default hook (divide, then allreduce). Returns the
        future of the averaged bucket and the allreduce's work."""
        stats = self.ctx.stats
        nbytes = buffer.numel() * buffer.element_size()
        stats.bucket_submitted(last, buffer.device)
        stats.add(bytes_uncompressed=nbytes, bytes_sent=nbytes, collectives=1)
        buffer.div_(self.ctx.world_size)
        tracer, clock = stats.tracer, stats.clock
        start = clock.mark()
        try:
            with tracer.span("issue", "issue", what="warm-up allreduce"):
                work = dist.all_reduce(buffer, group=group, async_op=True)
        except Exception as exc:
            stats.abandon_step()
            raise CommError(f"CaSync: warm-up allreduce could not be issued: {exc}") from exc
        end = clock.after([work])

        def done(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
            # runs on the backend's thread: holds the stats, never the process group
            try:
                out = fut.value()[0]
            except Exception as exc:
                stats.abandon_step()
                raise CommError(
                    "CaSync: warm-up allreduce failed (a peer may have exited or stalled past "
                    f"the process group's timeout; see the other ranks' logs): {exc}"
                ) from exc
            lap = Lap(start, end if end is not None else clock.mark())
            tracer.lap("warm-up allreduce", "comm", lap, lane=NETWORK_LANE, bytes=nbytes)
            stats.bucket_finished()
            return out

        return work.get_future().then(done), work

    def resume_at(self, step: int) -> None:
        """Continue from a checkpoint's ``step`` count: warm-up and the schedule stand there,
        and the statistics number the next step ``step``."""
        self.step = step
        self.ctx.stats.resume(step)

    def end_step(self) -> None:
        """Close the step: settle the unused guard, free the layouts of buckets DDP rebuilt,
        count the step and call ``on_step_end``."""
        self.open = False
        if self.unused is not None:
            self.unused.step_done()
        stale = [k for k, (_, _, used) in self._cache.items() if used < self.step]
        for k in stale:  # layouts of buckets DDP rebuilt: free their buffers
            del self._cache[k]
        self.step += 1
        self.ctx.stats.tracer.step_done()
        self.on_step_end(self.step)
