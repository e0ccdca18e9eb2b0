"""The compressed ring (:attr:`Strategy.RING <hipress.core.plan.Strategy.RING>`).

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

Every block of the round lives in one buffer of N blocks (the round's ``recv``): block s holds
shard s's payload as it passes through this rank, first the partial sums, then the aggregate.
A block is received into only once the send out of it has completed.

The hops run on a :class:`~hipress.casync.strategies.driver.RingDriver` thread, not on the hook's thread: they depend on each
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
The thread ends with the driver (``RingDriver.close``, called when its state is collected).

Non-finite flags travel with the partial sums (each rank ORs in its own), so the aggregate
carries the flags of every rank. A chunk that is non-finite anywhere comes out all-NaN on every
rank, and every state that encoded any of its shards is reset afterwards.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import torch.distributed as dist

from hipress.casync.clock import Lap, Mark
from hipress.casync.strategies.driver import RingDriver
from hipress.casync.strategies.surface import Operation
from hipress.casync.trace import NETWORK_LANE
from hipress.codec.flags import Flag, FlagMode

__all__ = ["RingDriver", "run_rounds"]  # (RingDriver: re-exported from .driver)

# a round's messages are told apart by tag (rounds of one bucket may be in flight together)
_TAG_BASE = 0x4850  # "HP"


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


def run_rounds(op: Operation, rounds: list[int], group: dist.ProcessGroup | None) -> None:
    """Drive the rounds' hops round-robin: wait for one round's receive, run its next hop."""
    stats = op.ctx.stats
    tracer, clock = stats.tracer, stats.clock
    active = []
    for i in rounds:
        gen = _RingRound(op, i, group).hops()
        active.append((gen, next(gen)))
    while active:
        following = []
        for gen, (work, posted, arrived) in active:
            t = time.perf_counter()
            with tracer.span("wait", "wait", what="ring hop"):
                work.wait()
            done = time.perf_counter()
            stats.add(wait_ms=done - t)
            lap = Lap(posted, arrived if arrived is not None else clock.mark())
            stats.add_lap("comm_ms", lap)
            tracer.lap("ring hop", "comm", lap, lane=NETWORK_LANE)
            with contextlib.suppress(StopIteration):
                following.append((gen, next(gen)))
        active = following


class _RingRound:
    """Round ``i`` of ``op`` on this rank: its 2(N-1) hops (:meth:`hops`) over the round's
    blocks (block s: shard s of every chunk, as it passes through this rank)."""

    def __init__(self, op: Operation, i: int, group: dist.ProcessGroup | None) -> None:
        io = op.round_io(i)
        self.op, self.ctx, self.buf, self.group = op, op.ctx, op.buffer, group
        self.n, self.r = op.ctx.world_size, op.ctx.rank
        self.rnd = io.round
        self.blocks = io.recv.view(self.n, self.rnd.block_nbytes)
        self.scratch = io.scratch
        self.own_flags = op.local_flags(self.rnd)
        self.tag = _TAG_BASE + i
        self.last_use: list[_Hop | None] = [None] * self.n  # the last hop that used each block

    def _hop(self, s: int) -> tuple[_Hop, Mark, Mark | None]:
        """Send block ``s`` right and receive block ``s - 1`` from the left, in one batch;
        returns the hop, when it was posted and when it completed (None: marked when the
        driver sees it complete), by the stats' clock."""
        n, into = self.n, (s - 1) % self.n
        before = self.last_use[into]
        if before is not None:  # the block still leaving must be gone before it is reused
            before.wait()
        blocks, group, tag = self.blocks, self.group, self.tag
        with self.ctx.stats.tracer.span("issue", "issue", what="ring hop"):
            works = dist.batch_isend_irecv([
            dist.P2POp(dist.isend, blocks[s], group=group, tag=tag, group_peer=(self.r + 1) % n),
            dist.P2POp(dist.irecv, blocks[into], group=group, tag=tag, group_peer=(self.r - 1) % n),
            ])  # fmt: skip
        done = _Hop(works)
        self.last_use[s] = self.last_use[into] = done
        self.op.issued(done)  # (drained after a failure)
        self.ctx.stats.add(collectives=1, bytes_sent=self.rnd.block_nbytes)
        # (marked after posting: on a GPU, posting queues nothing on the current stream, so
        # this mark is where the stream was when the hop was issued)
        clock = self.ctx.stats.clock
        return done, clock.mark(), clock.after(works)

    def _encode_own(self, s: int) -> None:
        """Reduce-scatter, hop 0: encode this rank's own shard ``s`` of every chunk."""
        ctx, blk = self.ctx, self.blocks[s]
        with ctx.stats.timed("encode_ms"):
            for _, c, off in self.rnd.slots():
                state = ctx.worker_states[c.layout.shard_key(s)]
                nbytes = c.layout.payloads[s]
                with ctx.codec("encode_ms"):
                    ctx.algorithm.encode(
                        c.shard_region(self.buf, s), state, out=blk[off : off + nbytes]
                    )
            self.rnd.write_flags(blk, self.own_flags)

    def _add_own(self, s: int, last: bool) -> list[Flag]:
        """Decode the partial sum of shard ``s`` that arrived, add this rank's shard and
        re-encode it (``last``: the full sum, averaged, with the server state); returns the
        flags, this rank's ORed in."""
        ctx, rnd, blk = self.ctx, self.rnd, self.blocks[s]
        alg, stats = ctx.algorithm, ctx.stats
        got = rnd.read_block_flags(self.op.flags, blk)
        flags = [FlagMode.either(a, b) for a, b in zip(got, self.own_flags, strict=True)]
        for _, c, off in rnd.slots():
            size, nbytes = c.shards[s], c.layout.payloads[s]
            acc = self.scratch[:size]
            with stats.timed("decode_ms"):
                with ctx.codec("decode_ms"):
                    alg.decode(blk[off : off + nbytes], size, out=acc)
                acc.add_(c.shard_region(self.buf, s))
                if last:
                    acc.div_(self.n)
            states = ctx.server_states if last else ctx.worker_states
            state = states[c.layout.shard_key(s, server=last)]
            with stats.timed("encode_ms"), ctx.codec("encode_ms"):
                alg.encode(acc, state, out=blk[off : off + nbytes])
        rnd.write_flags(blk, flags)
        return flags

    def _reset(self, flags: list[Flag]) -> None:
        """Flags hold every rank's now: reset every state that encoded a non-finite chunk."""
        ctx, r = self.ctx, self.r
        for idx, c, _ in self.rnd.slots():
            for j in range(self.n):
                states = ctx.server_states if j == r else ctx.worker_states
                FlagMode.reset(states[c.layout.shard_key(j, server=j == r)], flags[idx])

    def _decode_aggregate(self, s: int, flags: list[Flag]) -> None:
        """Decode aggregate ``s`` into the bucket (chunks flagged anywhere are left out)."""
        ctx = self.ctx
        with ctx.stats.timed("decode_ms"):
            for idx, c, off in self.rnd.slots():
                if flags[idx] is True:
                    continue
                size, nbytes = c.shards[s], c.layout.payloads[s]
                payload = self.blocks[s, off : off + nbytes]
                ctx.decode_into(
                    c.shard_region(self.buf, s), self.scratch, ctx.algorithm.decode, payload, size
                )

    def hops(self) -> Iterator[tuple[_Hop, Mark, Mark | None]]:
        """The round's hops; yields each receive to be waited for before going on, with the
        marks of :meth:`_hop`. Completes the op's part at the end."""
        n, r = self.n, self.r
        s = (r - 1) % n
        self._encode_own(s)
        yield self._hop(s)
        flags: list[Flag] = self.own_flags
        for h in range(1, n):  # hops 1 .. N-2, then the aggregate of shard r
            s = (r - h - 1) % n
            flags = self._add_own(s, last=h == n - 1)
            if h < n - 1:
                yield self._hop(s)
        self._reset(flags)
        for h in range(n):  # all-gather: forward aggregate r-h, decode it meanwhile
            s = (r - h) % n
            work = self._hop(s) if h < n - 1 else None
            self._decode_aggregate(s, flags)
            if work is not None:
                yield work
        for idx, c, _ in self.rnd.slots():
            FlagMode.fill_nan(c.region(self.buf), flags[idx])
        for hop in self.last_use:
            if hop is not None:
                hop.wait()
        self.op.part_done()
