"""Execution of one bucket's schedule: uncompressed allreduce, compressed allgather, compressed
PS (scatter-reduce + all-gather) and compressed ring (:mod:`hipress.casync.ring`), batched into
rounds and pipelined.

A :class:`BucketOp` runs in two stages, both on the caller's thread (the DDP hook's thread), so
every rank issues its collectives in the same order (gloo matches collectives by issue order;
issuing from completion callbacks, as PyTorch's PowerSGD hook does, breaks that):

- :meth:`BucketOp.start`: the allreduce of the uncompressed tensors, then for each round: encode
  its chunks and issue its collective asynchronously, so round r+1 encodes while round r is on
  the wire.
- :meth:`BucketOp.advance` (PS rounds only): for each round, wait for its all_to_all, decode and
  merge the shard this rank serves, average, re-encode and issue the all-gather.

Ring rounds use no collective: :meth:`BucketOp.start` hands them to the context's
:class:`~hipress.casync.ring.RingDriver` thread, whose point-to-point hops do not take part in
the collectives' issue order.

Decoding needs no collective, so it runs in the collectives' completion callbacks as soon as a
round arrives. :attr:`BucketOp.future` completes with the bucket buffer, averaged over the world
size and in the buffer's dtype, once every part is done, or with a :class:`CommError`.

CUDA buffers: a collective's future completes once the collective is enqueued, and its callbacks
run with current streams that wait for it, so each part's decode is ordered after its transfer.
Each part records an event on the stream its last work went to; the last part makes its stream
wait for all of them and completes :attr:`BucketOp.future`, which is created for the buffer's
device, so whoever waits on it (DDP) is ordered after every part.

Non-finite inputs: a chunk whose input holds NaN/Inf on any rank comes out all-NaN on every rank
(its flag travels in the round's message), and the states that encoded it are reset afterwards
so error feedback is not poisoned. The set of collectives never depends on the data. Flags of
CUDA buffers stay on the device (:mod:`hipress.casync.flags`): nothing in a step waits for the
GPU.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from hipress.casync.algorithm import (
    CompressionAlgorithm,
    chunk_key,
    decode_mean,
    encode_reporting,
)
from hipress.casync.bulk import BucketSchedule, Round, Workspace
from hipress.casync.errors import CaSyncError, CommError
from hipress.casync.flags import Flag, FlagMode
from hipress.casync.ring import RingDriver
from hipress.casync.stats import SyncStats
from hipress.secopa.plan import Strategy

# Works of failed operations, kept for the life of the process. A backend thread drops its
# reference to a work only after the work completes; if that is the last one, the work's tensors
# are released on that thread, which must take the GIL, and during interpreter shutdown a thread
# that takes the GIL is stopped mid-destructor (std::terminate: SIGABRT, the exit status lost).
_RETIRED: list[Any] = []
_SETTLE_S = 0.05


@atexit.register
def _settle() -> None:
    """At exit after a failure: let the backend threads leave Python (a completion callback,
    its release) before the interpreter stops threads from taking the GIL."""
    if _RETIRED:
        time.sleep(_SETTLE_S)


__all__ = ["BucketOp", "SyncContext", "all_gather"]

# torch 2.13 renamed all_gather_into_tensor (and deprecated the old name)
all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclass
class SyncContext:
    """What every bucket operation of one CaSync state shares.

    It holds no process group: completion callbacks reach this object, and the last
    reference to a process group must never drop on the backend's own thread (its destructor
    would join that thread). The group is passed to :meth:`BucketOp.start` and
    :meth:`BucketOp.advance` instead.

    Fields:
        rank, world_size: this rank and N in the process group.
        algorithm: the compression algorithm (None if nothing is compressed).
        worker_states, server_states: per-chunk states, see ``init_chunk_states``.
        stats: where figures are recorded.
        check_finite: whether to look for NaN/Inf in the input (one extra pass over the bucket).
        device_flags: keep non-finite flags on the device (None: for CUDA buffers; tests set it
            True to run that path on a CPU).
        codec_lock: serialises the algorithm's encode and decode calls, which run on the
            hook's thread, on the backend's completion threads and on the ring driver's thread:
            an algorithm object need not be thread-safe.
        ring: the thread that runs ring rounds (started at the first one).
    """

    rank: int
    world_size: int
    algorithm: CompressionAlgorithm | None
    worker_states: Mapping[str, Any]
    server_states: Mapping[str, Any]
    stats: SyncStats
    check_finite: bool = True
    device_flags: bool | None = None
    codec_lock: threading.Lock = field(default_factory=threading.Lock)
    ring: RingDriver = field(default_factory=RingDriver)

    @contextlib.contextmanager
    def codec(self, figure: str) -> Iterator[None]:
        """Hold :attr:`codec_lock` around one encode or decode call. The caller times the whole
        stage as ``figure`` (``encode_ms`` or ``decode_ms``); the time spent waiting here for
        the lock (another thread's call) is taken out of it and counted as ``codec_wait_ms``,
        so the two figures are compute, not turns at the lock."""
        t = time.perf_counter()
        with self.codec_lock:
            waited = time.perf_counter() - t
            self.stats.add(codec_wait_ms=waited, **{figure: -waited})
            try:
                yield
            except CaSyncError:
                raise
            except Exception as exc:  # this rank's own failure, not the network's
                what = "encoding" if figure == "encode_ms" else "decoding"
                raise CaSyncError(
                    f"CaSync: {what} failed on this rank ({type(exc).__name__}: {exc})"
                ) from exc


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
        self.ws = workspace
        self.buffer = buffer
        self.flags = FlagMode.for_tensor(buffer, ctx.device_flags)
        # a CUDA future records events of the current streams when it completes: its waiters
        # are ordered after them
        self.future: torch.futures.Future[torch.Tensor] = (
            torch.futures.Future(devices=[buffer.device])
            if buffer.is_cuda
            else torch.futures.Future()
        )
        self._events: list[torch.cuda.Event] = []
        self._lock = threading.Lock()
        self._remaining = (1 if schedule.allreduce_ranges else 0) + len(schedule.rounds)
        self._done = False
        self._ps_pending: list[tuple[int, dist.Work, float, list[float]]] = []
        self.works: list[Any] = []  # every collective (and ring hop) issued: drain() waits
        self._ran: list[threading.Event] = []  # set as each completion callback returns
        self._check = False  # look for NaN/Inf in this bucket's compressed chunks
        self._bucket_bad = True  # (host flags, ring rounds) the bucket holds NaN/Inf

    @property
    def deferred(self) -> bool:
        """Whether :meth:`advance` still has collectives to issue."""
        return bool(self._ps_pending)

    def _describe(self, what: str) -> str:
        names = self.schedule.names
        more = f" and {len(names) - 1} more" if len(names) > 1 else ""
        return f"{what} for bucket [{names[0]}{more}]"

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
        self.ws.busy = False
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
            self._ps_pending.clear()
        self.ws.busy = False
        self.ctx.stats.abandon_step()
        self.future.set_exception(err)
        return err

    def _issued(self, work: Any) -> Any:
        self.works.append(work)
        return work

    def drain(self) -> None:
        """Wait for every collective and ring hop this operation issued that has not completed,
        ignoring their errors: after a failure, nothing of it may still be pending when the
        process group is destroyed (gloo aborts the process then, losing its exit status), nor
        run a callback during interpreter shutdown."""
        works, self.works = self.works, []
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
        _RETIRED.extend(works)

    def _callback(self, what: str, fn: Any, *args: Any) -> Any:
        """A completion callback running ``fn(*args)`` once the collective succeeded, turning
        any failure into :meth:`fail` (callbacks run on the backend's threads: nothing may
        escape them, or the future would never complete)."""

        ran = threading.Event()
        self._ran.append(ran)

        def run(fut: torch.futures.Future[Any]) -> None:
            try:
                fut.value()
                fn(*args)
            except BaseException as exc:
                self.fail(exc, what)
            finally:
                ran.set()

        return run

    # ---- stage 1 ----------------------------------------------------------------------------

    def start(self, group: dist.ProcessGroup | None) -> None:
        """Issue the allreduce and every round's first collective on ``group`` (None: the
        default group); see the module docstring."""
        ctx, buf, rounds = self.ctx, self.buffer, self.schedule.rounds
        t = time.perf_counter()
        self._check = bool(ctx.check_finite and rounds)
        if (
            self._check
            and not self.flags.device
            and any(r.strategy is Strategy.RING for r in rounds)
        ):
            # the ring's first hop sends one shard of each chunk: it needs every chunk's flag
            # before encoding; on a CPU the bucket is read once, and its chunks only if that
            # finds NaN/Inf (counted as encoding)
            self._bucket_bad = bool(self.flags.nonfinite(buf))
        ctx.stats.add(
            bytes_uncompressed=buf.numel() * buf.element_size(),
            encode_ms=time.perf_counter() - t,
        )
        if self.schedule.allreduce_ranges:
            self._start_allreduce(group)
        ring = []
        for i, rnd in enumerate(self.schedule.rounds):
            if rnd.strategy is Strategy.PS:
                self._start_ps(i, rnd, group)
            elif rnd.strategy is Strategy.RING:
                ring.append(i)
            else:
                self._start_allgather(i, rnd, group)
        if ring:
            ctx.ring.submit(self, ring, group)

    def _start_allreduce(self, group: dist.ProcessGroup | None) -> None:
        ranges, buf = self.schedule.allreduce_ranges, self.buffer
        if len(ranges) == 1:
            off, n = ranges[0]
            flat = buf[off : off + n]
        else:
            flat = self.ws.allreduce
            pos = 0
            for off, n in ranges:
                flat[pos : pos + n].copy_(buf[off : off + n])
                pos += n
        # divide first, like DDP, so low-precision sums do not overflow
        flat.div_(self.ctx.world_size)
        t = time.perf_counter()
        work = self._issued(dist.all_reduce(flat, group=group, async_op=True))
        self.ctx.stats.add(collectives=1, bytes_sent=flat.numel() * flat.element_size())
        work.get_future().add_done_callback(
            self._callback("allreduce", self._finish_allreduce, flat, t)
        )

    def _finish_allreduce(self, flat: torch.Tensor, t_issue: float) -> None:
        self.ctx.stats.add(comm_ms=time.perf_counter() - t_issue)
        if len(self.schedule.allreduce_ranges) > 1:
            pos = 0
            for off, n in self.schedule.allreduce_ranges:
                self.buffer[off : off + n].copy_(flat[pos : pos + n])
                pos += n
        self.part_done()

    def local_flags(self, rnd: Round) -> list[Flag]:
        """Whether each of ``rnd``'s chunks holds NaN/Inf on this rank, read from the bucket
        before encoding (the ring's rounds)."""
        if not self._check or not self._bucket_bad:
            return [False] * len(rnd.chunks)
        return [self.flags.nonfinite(self.buffer[c.offset : c.offset + c.numel])
                for c in rnd.chunks]  # fmt: skip

    def _encode(self, region: torch.Tensor, state: Any, out: torch.Tensor) -> Flag:
        """Encode ``region`` (under the codec lock); whether it holds NaN/Inf (from the encode
        where the algorithm finds out, else by reading it; never when not checked)."""
        ctx = self.ctx
        assert ctx.algorithm is not None
        with ctx.codec("encode_ms"):
            if not self._check:
                ctx.algorithm.encode(region, state, out=out)
                return False
            bad = encode_reporting(ctx.algorithm, region, state, out)
        return self.flags.from_encode(bad, region)

    def _start_allgather(self, i: int, rnd: Round, group: dist.ProcessGroup | None) -> None:
        ctx, alg, buf = self.ctx, self.ctx.algorithm, self.buffer
        assert alg is not None
        send = self.ws.send[i]
        t = time.perf_counter()
        flags: list[Flag] = []
        for _, c, off in rnd.slots():
            state = ctx.worker_states[chunk_key(c.name, c.part, c.parts)]
            region = buf[c.offset : c.offset + c.numel]
            flags.append(self._encode(region, state, send[off : off + c.slot]))
            FlagMode.reset(state, flags[-1])
        FlagMode.write(send[rnd.flags_offset :], flags)
        t_issue = time.perf_counter()
        work = self._issued(all_gather(self.ws.recv[i], send, group=group, async_op=True))
        ctx.stats.add(encode_ms=t_issue - t, collectives=1, bytes_sent=send.numel())
        work.get_future().add_done_callback(
            self._callback("allgather", self._finish_allgather, i, t_issue)
        )

    def _finish_allgather(self, i: int, t_issue: float) -> None:
        ctx, alg, buf, n = self.ctx, self.ctx.algorithm, self.buffer, self.ctx.world_size
        assert alg is not None
        t = time.perf_counter()
        rnd = self.schedule.rounds[i]
        blocks = self.ws.recv[i].view(n, rnd.block_nbytes)
        flags = self.flags.gathered(blocks, rnd.flags_offset, len(rnd.chunks))
        for idx, c, off in rnd.slots():
            region = buf[c.offset : c.offset + c.numel]
            if flags[idx] is True:
                region.fill_(float("nan"))
                continue
            out = region if region.dtype == torch.float32 else self.ws.scratch[i][: c.numel]
            with ctx.codec("decode_ms"):
                decode_mean(alg, [blocks[r, off : off + c.slot] for r in range(n)], c.numel, out)
            if out is not region:
                region.copy_(out)
            FlagMode.fill_nan(region, flags[idx])
        ctx.stats.add(comm_ms=t - t_issue, decode_ms=time.perf_counter() - t)
        self.part_done()

    def _start_ps(self, i: int, rnd: Round, group: dist.ProcessGroup | None) -> None:
        ctx, alg, buf = self.ctx, self.ctx.algorithm, self.buffer
        assert alg is not None
        blocks = self.ws.send[i].view(ctx.world_size, rnd.block_nbytes)
        t = time.perf_counter()
        flags: list[Flag] = []
        for _, c, off in rnd.slots():
            pos = c.offset
            states = []
            bad: Flag = False
            for j, s in enumerate(c.shards):
                state = ctx.worker_states[chunk_key(c.name, c.part, c.parts, shard=j)]
                nbytes = alg.payload_nbytes(s)
                got = self._encode(buf[pos : pos + s], state, blocks[j, off : off + nbytes])
                bad = FlagMode.either(bad, got)
                states.append(state)
                pos += s
            flags.append(bad)
            for state in states:  # a shard held NaN/Inf: none of the chunk's states keeps it
                FlagMode.reset(state, bad)
        FlagMode.write(blocks[:, rnd.flags_offset :], flags)
        t_issue = time.perf_counter()
        work = self._issued(
            dist.all_to_all_single(self.ws.recv[i], self.ws.send[i], group=group, async_op=True)
        )
        done = [t_issue]
        ran = threading.Event()
        self._ran.append(ran)

        def arrived(_f: torch.futures.Future[Any]) -> None:
            done[0] = time.perf_counter()
            ran.set()

        work.get_future().add_done_callback(arrived)
        ctx.stats.add(encode_ms=t_issue - t, collectives=1, bytes_sent=self.ws.send[i].numel())
        self._ps_pending.append((i, work, t_issue, done))

    # ---- stage 2 ----------------------------------------------------------------------------

    def advance(self, group: dist.ProcessGroup | None) -> None:
        """Issue the all-gathers of the PS rounds: wait for each all_to_all, merge the shard
        this rank serves, average and re-encode it. Raises :class:`CommError` (and fails
        :attr:`future`) if a collective failed."""
        pending, self._ps_pending = self._ps_pending, []
        for i, work, t_issue, done in pending:
            t = time.perf_counter()
            try:
                work.wait()
            except Exception as exc:
                raise self.fail(exc, "PS all_to_all") from exc
            self.ctx.stats.add(wait_ms=time.perf_counter() - t, comm_ms=done[0] - t_issue)
            self._serve(i, self.schedule.rounds[i], group)

    def _serve(self, i: int, rnd: Round, group: dist.ProcessGroup | None) -> None:
        ctx, alg, n, rank = self.ctx, self.ctx.algorithm, self.ctx.world_size, self.ctx.rank
        assert alg is not None
        blocks = self.ws.recv[i].view(n, rnd.block_nbytes)
        flags = self.flags.gathered(blocks, rnd.flags_offset, len(rnd.chunks))
        own = blocks[rank]
        t, t_enc = time.perf_counter(), 0.0
        for idx, c, off in rnd.slots():
            s = c.shards[rank]
            nbytes = alg.payload_nbytes(s)
            merged = self.ws.scratch[i][:s]
            with ctx.codec("decode_ms"):
                decode_mean(alg, [blocks[r, off : off + nbytes] for r in range(n)], s, merged)
            t0 = time.perf_counter()
            state = ctx.server_states[chunk_key(c.name, c.part, c.parts, shard=rank, server=True)]
            # overwrites this rank's own slot of chunk idx, which was decoded just above
            with ctx.codec("encode_ms"):
                alg.encode(merged, state, out=own[off : off + nbytes])
            FlagMode.reset(state, flags[idx])
            t_enc += time.perf_counter() - t0
        FlagMode.write(own[rnd.flags_offset :], flags)
        t_issue = time.perf_counter()
        work = self._issued(all_gather(self.ws.send[i], own, group=group, async_op=True))
        ctx.stats.add(
            encode_ms=t_enc,
            decode_ms=t_issue - t - t_enc,
            collectives=1,
            bytes_sent=rnd.block_nbytes,
        )
        work.get_future().add_done_callback(
            self._callback("PS all-gather", self._finish_ps, i, t_issue)
        )

    def _finish_ps(self, i: int, t_issue: float) -> None:
        ctx, alg, buf, n = self.ctx, self.ctx.algorithm, self.buffer, self.ctx.world_size
        assert alg is not None
        t = time.perf_counter()
        rnd = self.schedule.rounds[i]
        blocks = self.ws.send[i].view(n, rnd.block_nbytes)
        flags = self.flags.gathered(blocks, rnd.flags_offset, len(rnd.chunks))
        for idx, c, off in rnd.slots():
            if flags[idx] is True:
                buf[c.offset : c.offset + c.numel].fill_(float("nan"))
                continue
            pos = c.offset
            for j, s in enumerate(c.shards):
                region = buf[pos : pos + s]
                out = region if region.dtype == torch.float32 else self.ws.scratch[i][:s]
                with ctx.codec("decode_ms"):
                    alg.decode(blocks[j, off : off + alg.payload_nbytes(s)], s, out=out)
                if out is not region:
                    region.copy_(out)
                pos += s
            FlagMode.fill_nan(buf[c.offset : c.offset + c.numel], flags[idx])
        ctx.stats.add(comm_ms=t - t_issue, decode_ms=time.perf_counter() - t)
        self.part_done()
