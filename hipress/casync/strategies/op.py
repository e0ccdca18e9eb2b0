"""One bucket's synchronisation: :class:`BucketOp`, the lifecycle every strategy shares.

A :class:`BucketOp` runs in two stages, both on the caller's thread (the DDP hook's thread), so
every rank issues its collectives in the same order (gloo matches collectives by issue order;
issuing from completion callbacks, as PyTorch's PowerSGD hook does, breaks that):

- :meth:`BucketOp.start`: the allreduce of the uncompressed tensors
  (:mod:`~hipress.casync.strategies.allreduce`), then for each round: encode its chunks and
  issue its collective asynchronously (:mod:`~hipress.casync.strategies.allgather`,
  :mod:`~hipress.casync.strategies.ps`), so round r+1 encodes while round r is on the wire.
  Ring rounds (:mod:`~hipress.casync.strategies.ring`) go to the context's ring thread, whose
  point-to-point hops take no part in the collectives' issue order.
- :meth:`BucketOp.advance`: the second phases a strategy deferred (PS: wait for its
  all_to_all, merge, re-encode, issue the all-gather).

A strategy reaches the operation only through its public surface: :meth:`BucketOp.round_io`
(a round's layout and buffers), :meth:`BucketOp.encode`, :meth:`BucketOp.issue` (counts a
collective and records its communication time at completion), :meth:`BucketOp.defer` and
:meth:`BucketOp.part_done`.

Decoding needs no collective, so it runs in the collectives' completion callbacks as soon as a
round arrives. :attr:`BucketOp.future` completes with the bucket buffer, averaged over the world
size and in the buffer's dtype, once every part is done, or with a :class:`CommError`.

CUDA buffers: a collective's future completes once the collective is enqueued, and its callbacks
run with current streams that wait for it, so each part's decode is ordered after its transfer.
Each part records an event on the stream its last work went to; the last part makes its stream
wait for all of them and completes :attr:`BucketOp.future`, which is created for the buffer's
device, so whoever waits on it (DDP) is ordered after every part.

Times: collectives, encodes and decodes are timed by the stats' clock
(:mod:`hipress.casync.clock`): on a CPU the wall clock at issue and at completion; on a GPU
events in the streams' order (a collective from when the issuing stream reached it to its end
on the NCCL stream, recorded at issue), read after the device has done the work, never waited
for here.

Non-finite inputs: a chunk whose input holds NaN/Inf on any rank comes out all-NaN on every rank
(its flag travels in the round's message), and the states that encoded it are reset afterwards
so error feedback is not poisoned. The set of collectives never depends on the data. Flags of
CUDA buffers stay on the device (:mod:`hipress.codec.flags`): nothing in a step waits for the
GPU.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from hipress.casync.bulk import BucketSchedule, Round, Workspace
from hipress.casync.clock import Lap, Mark
from hipress.casync.strategies import allgather, allreduce, ps, ring, rowsparse
from hipress.casync.strategies.context import RETIRED, SyncContext
from hipress.casync.strategies.surface import Group, RoundIO
from hipress.casync.trace import NETWORK_LANE
from hipress.codec.algorithm import encode_reporting
from hipress.codec.errors import CaSyncError, CommError
from hipress.codec.flags import Flag, FlagMode
from hipress.core.plan import Strategy

__all__ = ["BucketOp", "RoundIO"]


@dataclass
class _Deferred:
    """A second phase waiting in :meth:`BucketOp.advance`: the work to wait for, its
    communication time (from its issue to its arrival; none until it arrived), and what runs
    then."""

    work: Any
    what: str
    then: Callable[[Group], None]
    lap: Lap


class BucketOp:
    """Synchronisation of one bucket buffer under one schedule (see the module docstring).

    Use: ``op.start()``; then ``op.advance()`` (a no-op unless :attr:`deferred`); the result
    arrives in :attr:`future`. Both calls must happen on every rank in the same order relative
    to other operations on the process group.
    """

    def __init__(
        self,
        ctx: SyncContext,
        schedule: BucketSchedule,
        workspace: Workspace,
        buffer: torch.Tensor,
    ) -> None:
        if buffer.dim() != 1 or buffer.numel() != schedule.numel or not buffer.is_contiguous():
            raise CaSyncError(
                f"bucket buffer of shape {tuple(buffer.shape)} does not match the layout of "
                f"{schedule.numel} elements for {list(schedule.names[:3])}..."
            )
        if workspace.busy:
            raise CaSyncError(
                f"bucket layout [{schedule.names[0]}, ...] submitted again before its previous "
                "synchronisation completed: wait for its future first"
            )
        workspace.busy = True
        self.ctx = ctx
        self.schedule = schedule
        self.buffer = buffer
        self.flags = FlagMode.for_tensor(buffer, ctx.device_flags)
        # a CUDA future records events of the current streams when it completes: its waiters
        # are ordered after them
        self.future: torch.futures.Future[torch.Tensor] = (
            torch.futures.Future(devices=[buffer.device])
            if buffer.is_cuda
            else torch.futures.Future()
        )
        self._ws = workspace
        self._events: list[torch.cuda.Event] = []
        self._lock = threading.Lock()
        self._remaining = (
            (1 if schedule.allreduce_ranges else 0) + len(schedule.rounds) + len(schedule.sparse)
        )
        self._done = False
        self._deferred: list[_Deferred] = []
        self._works: list[Any] = []  # every collective (and ring hop) issued: drain() waits
        self._ran: list[threading.Event] = []  # set as each completion callback returns
        self.check = False  # look for NaN/Inf in this bucket's compressed chunks
        self._bucket_bad = True  # (host flags, ring rounds) the bucket holds NaN/Inf

    @property
    def deferred(self) -> bool:
        """Whether :meth:`advance` still has collectives to issue."""
        return bool(self._deferred)

    def _describe(self, what: str) -> str:
        names = self.schedule.names
        more = f" and {len(names) - 1} more" if len(names) > 1 else ""
        return f"{what} for bucket [{names[0]}{more}]"

    # ---- what strategies use ----------------------------------------------------------------

    def round_io(self, i: int) -> RoundIO:
        """Round ``i``'s layout and buffers."""
        ws = self._ws
        return RoundIO(i, self.schedule.rounds[i], ws.send[i], ws.recv[i], ws.scratch[i])

    @property
    def staging(self) -> torch.Tensor:
        """The allreduce's staging buffer (used when its ranges are not contiguous)."""
        return self._ws.allreduce

    def encode(self, region: torch.Tensor, state: Any, out: torch.Tensor) -> Flag:
        """Encode ``region`` (under the codec lock); whether it holds NaN/Inf (from the encode
        where the algorithm finds out, else by reading it; never when not checked)."""
        ctx = self.ctx
        with ctx.codec("encode_ms"):
            if not self.check:
                ctx.algorithm.encode(region, state, out=out)
                return False
            bad = encode_reporting(ctx.algorithm, region, state, out)
        return self.flags.from_encode(bad, region)

    def local_flags(self, rnd: Round) -> list[Flag]:
        """Whether each of ``rnd``'s chunks holds NaN/Inf on this rank, read from the bucket
        before encoding (the ring's rounds)."""
        if not self.check or not self._bucket_bad:
            return [False] * len(rnd.chunks)
        return [self.flags.nonfinite(c.region(self.buffer)) for c in rnd.chunks]

    def issued(self, work: Any) -> Any:
        """Keep ``work`` (a collective or a ring hop) for :meth:`drain`; returns it."""
        self._works.append(work)
        return work

    def issue(
        self, launch: Callable[[], Any], nbytes: int, what: str, then: Callable[..., None],
        *args: Any,
    ) -> None:  # fmt: skip
        """Issue a collective (``launch()`` returns its work; one call, ``nbytes`` sent) and,
        once it succeeded, record its communication time and run ``then(*args)`` on the
        completion thread (``what`` names it in errors)."""
        stats, tracer = self.ctx.stats, self.ctx.stats.tracer
        clock = stats.clock
        start = clock.mark()
        with tracer.span("issue", "issue", what=what):
            work = self.issued(launch())
        end = clock.after([work])
        stats.add(collectives=1, bytes_sent=nbytes)

        def timed() -> None:
            lap = Lap(start, end if end is not None else clock.mark())
            stats.add_lap("comm_ms", lap)
            tracer.lap(what, "comm", lap, lane=NETWORK_LANE, bytes=nbytes)
            then(*args)

        work.get_future().add_done_callback(self._callback(what, timed))

    def defer(
        self, launch: Callable[[], Any], nbytes: int, what: str, then: Callable[[Group], None]
    ) -> None:
        """Issue a collective like :meth:`issue`; :meth:`advance` waits for it and runs
        ``then(group)`` on the caller's thread (a second phase that issues more)."""
        tracer, clock = self.ctx.stats.tracer, self.ctx.stats.clock
        start: Mark = clock.mark()
        with tracer.span("issue", "issue", what=what):
            work = self.issued(launch())
        end = clock.after([work])
        entry = _Deferred(work, what, then, lap=Lap(start, start))
        ran = threading.Event()
        self._ran.append(ran)

        def arrived(_f: torch.futures.Future[Any]) -> None:
            entry.lap = Lap(start, end if end is not None else clock.mark())
            tracer.lap(what, "comm", entry.lap, lane=NETWORK_LANE, bytes=nbytes)
            ran.set()

        work.get_future().add_done_callback(arrived)
        self.ctx.stats.add(collectives=1, bytes_sent=nbytes)
        self._deferred.append(entry)

    # ---- completion -------------------------------------------------------------------------

    def part_done(self) -> None:
        """One part (the allreduce, a round) is done: its work is queued on the current
        stream. The last part completes :attr:`future`."""
        event = None
        if self.buffer.is_cuda:
            event = torch.cuda.current_stream(self.buffer.device).record_event()
        with self._lock:
            if event is not None:
                self._events.append(event)
            self._remaining -= 1
            if self._remaining or self._done:
                return
            self._done = True
            events, self._events = self._events, []
        if events:
            stream = torch.cuda.current_stream(self.buffer.device)
            for ev in events:
                stream.wait_event(ev)
        self._ws.busy = False
        self.ctx.stats.bucket_finished()
        self.future.set_result(self.buffer)

    def _error(self, what: str, exc: BaseException) -> CaSyncError:
        if isinstance(exc, CaSyncError):
            return exc
        return CommError(
            f"CaSync: {self._describe(what)} failed (a peer may have exited or stalled past "
            f"the process group's timeout; see the other ranks' logs): {exc}"
        )

    def fail(self, exc: BaseException, what: str = "synchronisation") -> CaSyncError:
        """Complete :attr:`future` with a :class:`CaSyncError` wrapping ``exc`` (once; later
        calls change nothing). Returns the error."""
        err = self._error(what, exc)
        with self._lock:
            if self._done:
                return err
            self._done = True
            self._deferred.clear()
        self._ws.busy = False
        self.ctx.stats.abandon_step()
        self.future.set_exception(err)
        return err

    def drain(self) -> None:
        """Wait for every collective and ring hop this operation issued that has not completed,
        ignoring their errors: after a failure, nothing of it may still be pending when the
        process group is destroyed (gloo aborts the process then, losing its exit status), nor
        run a callback during interpreter shutdown."""
        works, self._works = self._works, []
        for w in works:
            try:
                if hasattr(w, "is_completed") and w.is_completed():
                    continue
                w.wait()
            except Exception:
                pass
        ran, self._ran = self._ran, []
        for ev in ran:  # a work completes before its callbacks run: they must be over too
            ev.wait(timeout=5.0)
        RETIRED.extend(works)

    def settle(self) -> None:
        """After :attr:`future` completed: wait until every collective this operation issued
        has finished on its backend's thread and every completion callback has returned. A
        future wakes its waiters from inside the completion callback, before the backend ends
        the collective's profiler range; nothing of the step may still run on another thread
        once the step's last hook returns (a profiler stopped then reads what that thread is
        writing)."""
        works, self._works = self._works, []
        for w in works:
            w.wait()
        ran, self._ran = self._ran, []
        for ev in ran:
            ev.wait(timeout=5.0)

    def _callback(self, what: str, fn: Callable[[], None]) -> Callable[[Any], None]:
        """A completion callback running ``fn()`` once the collective succeeded, turning any
        failure into :meth:`fail` (callbacks run on the backend's threads: nothing may escape
        them, or the future would never complete)."""

        ran = threading.Event()
        self._ran.append(ran)

        def run(fut: torch.futures.Future[Any]) -> None:
            try:
                fut.value()
                fn()
            except BaseException as exc:
                self.fail(exc, what)
            finally:
                ran.set()

        return run

    # ---- the two stages ---------------------------------------------------------------------

    def start(self, group: Group) -> None:
        """Issue the allreduce and every round's first collective on ``group`` (None: the
        default group); see the module docstring."""
        ctx, buf, rounds = self.ctx, self.buffer, self.schedule.rounds
        self.check = bool(ctx.check_finite and rounds)
        with ctx.stats.timed("encode_ms"):
            if (
                self.check
                and not self.flags.device
                and any(r.strategy is Strategy.RING for r in rounds)
            ):
                # the ring's first hop sends one shard of each chunk: it needs every chunk's
                # flag before encoding; on a CPU the bucket is read once, and its chunks only
                # if that finds NaN/Inf (counted as encoding)
                self._bucket_bad = bool(self.flags.nonfinite(buf))
        ctx.stats.add(bytes_uncompressed=buf.numel() * buf.element_size())
        if self.schedule.allreduce_ranges:
            allreduce.start(self, group)
        for offset, entry in self.schedule.sparse:
            rowsparse.start(self, offset, entry, group)
        ring_rounds = []
        for i, rnd in enumerate(rounds):
            if rnd.strategy is Strategy.PS:
                ps.start(self, self.round_io(i), group)
            elif rnd.strategy is Strategy.RING:
                ring_rounds.append(i)
            else:
                allgather.start(self, self.round_io(i), group)
        if ring_rounds:
            ctx.ring.submit(self, ring_rounds, group)

    def run_ring(self, rounds: list[int], group: Group) -> None:
        """Run ring rounds ``rounds`` (on the context's ring thread, which calls this)."""
        ring.run_rounds(self, rounds, group)

    def advance(self, group: Group) -> None:
        """Run the deferred second phases (PS: wait for each all_to_all, merge the shard this
        rank serves, average, re-encode it and issue the all-gather). Raises
        :class:`CommError` (and fails :attr:`future`) if a collective failed."""
        pending, self._deferred = self._deferred, []
        for d in pending:
            t = time.perf_counter()
            try:
                with self.ctx.stats.tracer.span("wait", "wait", what=d.what):
                    d.work.wait()
            except Exception as exc:
                raise self.fail(exc, d.what) from exc
            self.ctx.stats.add(wait_ms=time.perf_counter() - t)
            self.ctx.stats.add_lap("comm_ms", d.lap)
            d.then(group)
