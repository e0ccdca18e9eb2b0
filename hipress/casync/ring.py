"""The compressed ring (:attr:`Strategy.RING <hipress.secopa.plan.Strategy.RING>`).

A ring round carries partition r of every RING tensor of a bucket; each chunk splits into N
shards, laid out like PS (:mod:`hipress.casync.bulk`). Rank r, with right neighbour r+1 and left
neighbour r-1 (mod N), runs 2(N-1) dependent hops, each a point-to-point send and receive of one
block (one shard of every chunk, plus the non-finite flags):

- reduce-scatter, hop h = 0 .. N-2: rank r sends shard ``r-h-1``; at hop 0 it encodes its own
  gradient, later it decodes the partial sum it just received for that shard, adds its own
  gradient and re-encodes (its worker state of that shard). After the last hop it holds the sum
  of every rank for shard r: it adds its own, averages and re-encodes it (its server state).
- all-gather, hop h = 0 .. N-2: rank r forwards aggregate ``r-h`` as it received it and decodes
  it into the bucket, so every rank decodes the same N payloads.

Every block of the round lives in one buffer of N blocks (``Workspace.recv``): block s holds
shard s's payload as it passes through this rank, first the partial sums, then the aggregate.
A block is received into only once the send out of it has completed.

The hops run on a :class:`RingDriver` thread, not on the hook's thread: they depend on each
other, so issuing them from the hook would stall backward. Point-to-point messages in gloo are
matched by peer and tag, not by issue order among collectives, so this thread never disturbs
the order of the hook's collectives. Rounds are pipelined: the driver takes one hop of each
round in turn, so round r+1's transfer is on the wire while round r decodes and re-encodes.

A hop is one ``batch_isend_irecv`` of its send and its receive: every rank takes part in the
first one (NCCL then creates its point-to-point communicators together instead of blocking in a
cycle for N >= 3), and NCCL, which ignores tags, matches the k-th message on a link with the
k-th one expected, the same on every rank. On CUDA buffers the driver thread sets the buffer's
device and works on a stream of its own that first waits for the hook's stream (the bucket is
ready), so the ring's encodes and decodes overlap backward; the op's future then waits for it.
The thread ends with the :class:`RingDriver` (:meth:`RingDriver.close`, called when its state
is collected).

Non-finite flags travel with the partial sums (each rank ORs in its own), so the aggregate
carries the flags of every rank. A chunk that is non-finite anywhere comes out all-NaN on every
rank, and every state that encoded any of its shards is reset afterwards.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from hipress.casync.algorithm import chunk_key
from hipress.casync.bulk import Chunk, Round
from hipress.casync.errors import CaSyncError
from hipress.casync.flags import Flag, FlagMode

if TYPE_CHECKING:
    from hipress.casync.strategies import BucketOp

__all__ = ["RingDriver"]

# a round's messages are told apart by tag (rounds of one bucket may be in flight together)
_TAG_BASE = 0x4850  # "HP"


class RingDriver:
    """A daemon thread running the ring rounds of bucket operations, in submission order.

    Every rank submits the same operations in the same order (the hook's bucket order), so the
    k-th message rank r sends to r+1 is the k-th one r+1 expects. After a failure every later
    operation fails at once with the same error instead of waiting out the timeout again.
    :meth:`close` ends the thread (idempotent; the owner calls it when it is collected).
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[
            tuple[BucketOp, list[int], dist.ProcessGroup | None, torch.cuda.Event | None] | None
        ] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._broken: CaSyncError | None = None
        self._closed = False

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(self, op: BucketOp, rounds: list[int], group: dist.ProcessGroup | None) -> None:
        """Run ``op``'s ring rounds (indices into its schedule) on the driver thread."""
        if self._closed:
            raise CaSyncError("the CaSync state's ring thread was closed")
        ready = None
        if op.buffer.is_cuda:  # the bucket is complete on the hook's current stream
            ready = torch.cuda.current_stream(op.buffer.device).record_event()
        with self._start_lock:
            if self._closed:
                raise CaSyncError("the CaSync state's ring thread was closed")
            if self._thread is None:
                self._thread = threading.Thread(
                    target=_drive, args=(self._queue, self), name="hipress-casync-ring",
                    daemon=True,
                )  # fmt: skip
                self._thread.start()
        self._queue.put((op, rounds, group, ready))

    def close(self) -> None:
        """End the thread once the rounds queued before are done."""
        with self._start_lock:
            if self._closed:
                return
            self._closed = True
            if self._thread is not None:
                self._queue.put(None)

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)


def _drive(jobs: queue.SimpleQueue, driver: RingDriver) -> None:  # type: ignore[type-arg]
    streams: dict[torch.device, torch.cuda.Stream] = {}
    while True:
        job = jobs.get()
        if job is None:
            return
        op, rounds, group, ready = job
        if driver._broken is not None:
            op.fail(driver._broken, "ring")
        else:
            try:
                if ready is None:
                    _run_rounds(op, rounds, group)
                else:
                    dev = op.buffer.device
                    torch.cuda.set_device(dev)
                    stream = streams.setdefault(dev, torch.cuda.Stream(dev))
                    with torch.cuda.stream(stream):
                        stream.wait_event(ready)
                        _run_rounds(op, rounds, group)
            except BaseException as exc:
                driver._broken = op.fail(exc, "ring transfer")
        # hold nothing while idle: the op's buffers and the group belong to the hook
        del op, rounds, group, ready, job


class _Hop:
    """A hop's works, waited for as one (NCCL may return one work for the batch), once: a
    gloo work waited for a second time blocks until the group's timeout."""

    def __init__(self, works: list[dist.Work]) -> None:
        self.works = works  # kept after waiting (see strategies._RETIRED)
        self._waited = False

    def is_completed(self) -> bool:
        return self._waited

    def wait(self) -> None:
        if self._waited:
            return
        self._waited = True
        for w in self.works:
            w.wait()


def _run_rounds(op: BucketOp, rounds: list[int], group: dist.ProcessGroup | None) -> None:
    """Drive the rounds' hops round-robin: wait for one round's receive, run its next hop."""
    stats = op.ctx.stats
    active = []
    for i in rounds:
        gen = _ring_round(op, i, group)
        active.append((gen, next(gen)))
    while active:
        following = []
        for gen, (work, t_post) in active:
            t = time.perf_counter()
            work.wait()
            done = time.perf_counter()
            stats.add(wait_ms=done - t, comm_ms=done - t_post)
            with contextlib.suppress(StopIteration):
                following.append((gen, next(gen)))
        active = following


def _ring_round(
    op: BucketOp, i: int, group: dist.ProcessGroup | None
) -> Iterator[tuple[_Hop, float]]:
    """Round ``i``'s 2(N-1) hops; yields each receive to be waited for before going on, with
    the time it was posted."""
    ctx, buf = op.ctx, op.buffer
    alg, n, r = ctx.algorithm, ctx.world_size, ctx.rank
    assert alg is not None
    rnd: Round = op.schedule.rounds[i]
    blocks = op.ws.recv[i].view(n, rnd.block_nbytes)
    scratch = op.ws.scratch[i]
    fo, nc = rnd.flags_offset, len(rnd.chunks)
    fm = op.flags
    own_flags = op.local_flags(rnd)
    right, left, tag = (r + 1) % n, (r - 1) % n, _TAG_BASE + i
    hops: list[_Hop | None] = [None] * n  # the last hop that used each block

    def region(c: Chunk, s: int) -> torch.Tensor:
        pos = c.offset + c.shard_offset(s)
        return buf[pos : pos + c.shards[s]]

    def hop(s: int, into: int) -> tuple[_Hop, float]:
        """Send block ``s`` right and receive block ``into`` from the left, in one batch."""
        before = hops[into]
        if before is not None:  # the block still leaving must be gone before it is reused
            before.wait()
        done = _Hop(dist.batch_isend_irecv([
            dist.P2POp(dist.isend, blocks[s], group=group, tag=tag, group_peer=right),
            dist.P2POp(dist.irecv, blocks[into], group=group, tag=tag, group_peer=left),
        ]))  # fmt: skip
        hops[s] = hops[into] = done
        op.works.append(done)  # (drained after a failure)
        return done, time.perf_counter()

    # reduce-scatter, hop 0: encode my own shard r-1
    t = time.perf_counter()
    s = (r - 1) % n
    blk = blocks[s]
    for _, c, off in rnd.slots():
        state = ctx.worker_states[chunk_key(c.name, c.part, c.parts, shard=s)]
        nbytes = alg.payload_nbytes(c.shards[s])
        with ctx.codec("encode_ms"):
            alg.encode(region(c, s), state, out=blk[off : off + nbytes])
    FlagMode.write(blk[fo:], own_flags)
    ctx.stats.add(encode_ms=time.perf_counter() - t, collectives=1, bytes_sent=rnd.block_nbytes)
    yield hop(s, (s - 1) % n)

    # reduce-scatter, hops 1 .. N-2, then the aggregate of shard r
    flags: list[Flag] = own_flags
    for h in range(1, n):
        s = (r - h - 1) % n
        last = h == n - 1  # s == r: the full sum has arrived
        blk = blocks[s]
        t, t_enc = time.perf_counter(), 0.0
        got = fm.read(blk[fo : fo + nc])
        flags = [FlagMode.either(a, b) for a, b in zip(got, own_flags, strict=True)]
        for _, c, off in rnd.slots():
            size = c.shards[s]
            nbytes = alg.payload_nbytes(size)
            acc = scratch[:size]
            with ctx.codec("decode_ms"):
                alg.decode(blk[off : off + nbytes], size, out=acc)
            acc.add_(region(c, s))
            if last:
                acc.div_(n)
                key = chunk_key(c.name, c.part, c.parts, shard=s, server=True)
                state = ctx.server_states[key]
            else:
                state = ctx.worker_states[chunk_key(c.name, c.part, c.parts, shard=s)]
            t0 = time.perf_counter()
            with ctx.codec("encode_ms"):
                alg.encode(acc, state, out=blk[off : off + nbytes])
            t_enc += time.perf_counter() - t0
        FlagMode.write(blk[fo:], flags)
        ctx.stats.add(encode_ms=t_enc, decode_ms=time.perf_counter() - t - t_enc)
        if last:
            break
        ctx.stats.add(collectives=1, bytes_sent=rnd.block_nbytes)
        yield hop(s, (s - 1) % n)

    # flags now hold every rank's: reset what encoded a non-finite chunk
    for idx, c, _ in rnd.slots():
        for j in range(n):
            key = chunk_key(c.name, c.part, c.parts, shard=j, server=j == r)
            FlagMode.reset((ctx.server_states if j == r else ctx.worker_states)[key], flags[idx])

    # all-gather: forward aggregate r-h, decode it while the next one arrives
    for h in range(n):
        s = (r - h) % n
        if h < n - 1:
            ctx.stats.add(collectives=1, bytes_sent=rnd.block_nbytes)
            work = hop(s, (s - 1) % n)
        t = time.perf_counter()
        for idx, c, off in rnd.slots():
            if flags[idx] is True:
                continue
            out = region(c, s)
            size = c.shards[s]
            target = out if out.dtype == torch.float32 else scratch[:size]
            with ctx.codec("decode_ms"):
                alg.decode(blocks[s, off : off + alg.payload_nbytes(size)], size, out=target)
            if target is not out:
                out.copy_(target)
        ctx.stats.add(decode_ms=time.perf_counter() - t)
        if h < n - 1:
            yield work

    for idx, c, _ in rnd.slots():
        FlagMode.fill_nan(buf[c.offset : c.offset + c.numel], flags[idx])
    for h in hops:
        if h is not None:
            h.wait()
    op.part_done()
