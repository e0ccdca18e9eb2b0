"""The compressed PS (scatter-reduce + all-gather, a server co-located on every worker).

Each chunk splits into N shards, each encoded; an all_to_all sends shard j of every worker to
worker j (:func:`start`). In the operation's second stage (:meth:`BucketOp.advance
<hipress.casync.strategies.op.BucketOp.advance>`), worker j decodes and averages the N payloads
of its shard, re-encodes the aggregate with its server state and all-gathers it
(:func:`_serve`); every worker then decodes the N aggregates into the bucket (:func:`_finish`).
"""

from __future__ import annotations

import torch.distributed as dist

from hipress.casync.strategies.context import all_gather
from hipress.casync.strategies.surface import Operation, RoundIO
from hipress.codec.algorithm import decode_mean
from hipress.codec.flags import Flag, FlagMode

__all__ = ["start"]


def start(op: Operation, io: RoundIO, group: dist.ProcessGroup | None) -> None:
    """Encode every shard of the round's chunks into the block of the worker serving it (a
    chunk's flag: any of its shards) and issue the all_to_all; its second phase is deferred."""
    ctx, buf, rnd = op.ctx, op.buffer, io.round
    blocks = io.send.view(ctx.world_size, rnd.block_nbytes)
    with ctx.stats.timed("encode_ms"):
        flags: list[Flag] = []
        for _, c, off in rnd.slots():
            states = []
            bad: Flag = False
            for j, nbytes in enumerate(c.layout.payloads):
                state = ctx.worker_states[c.layout.shard_key(j)]
                got = op.encode(c.shard_region(buf, j), state, blocks[j, off : off + nbytes])
                bad = FlagMode.either(bad, got)
                states.append(state)
            flags.append(bad)
            for state in states:  # a shard held NaN/Inf: none of the chunk's states keeps it
                FlagMode.reset(state, bad)
        rnd.write_flags(blocks, flags)
    op.defer(
        lambda: dist.all_to_all_single(io.recv, io.send, group=group, async_op=True),
        io.send.numel(), "PS all_to_all", lambda g: _serve(op, io, g),
    )  # fmt: skip


def _serve(op: Operation, io: RoundIO, group: dist.ProcessGroup | None) -> None:
    """The all_to_all arrived: merge and average the shard this rank serves, re-encode it
    into this rank's own block and all-gather the blocks."""
    ctx, alg, n, rank = op.ctx, op.ctx.algorithm, op.ctx.world_size, op.ctx.rank
    rnd = io.round
    blocks = io.recv.view(n, rnd.block_nbytes)
    own = blocks[rank]
    with ctx.stats.timed("decode_ms"):
        flags = rnd.read_flags(op.flags, blocks)
    for idx, c, off in rnd.slots():
        s, nbytes = c.shards[rank], c.layout.payloads[rank]
        merged = io.scratch[:s]
        with ctx.stats.timed("decode_ms"), ctx.codec("decode_ms"):
            decode_mean(alg, [blocks[r, off : off + nbytes] for r in range(n)], s, merged)
        state = ctx.server_states[c.layout.shard_key(rank, server=True)]
        # overwrites this rank's own slot of chunk idx, which was decoded just above
        with ctx.stats.timed("encode_ms"):
            with ctx.codec("encode_ms"):
                alg.encode(merged, state, out=own[off : off + nbytes])
            FlagMode.reset(state, flags[idx])
    rnd.write_flags(own, flags)
    op.issue(
        lambda: all_gather(io.send, own, group=group, async_op=True),
        rnd.block_nbytes, "PS all-gather", _finish, op, io,
    )  # fmt: skip


def _finish(op: Operation, io: RoundIO) -> None:
    """Every aggregate arrived: decode each shard into the bucket."""
    ctx, alg, buf, n = op.ctx, op.ctx.algorithm, op.buffer, op.ctx.world_size
    rnd = io.round
    with ctx.stats.timed("decode_ms"):
        blocks = io.send.view(n, rnd.block_nbytes)
        flags = rnd.read_flags(op.flags, blocks)
        for idx, c, off in rnd.slots():
            if flags[idx] is True:
                c.region(buf).fill_(float("nan"))
                continue
            for j, (s, nbytes) in enumerate(zip(c.shards, c.layout.payloads, strict=True)):
                payload = blocks[j, off : off + nbytes]
                ctx.decode_into(c.shard_region(buf, j), io.scratch, alg.decode, payload, s)
            FlagMode.fill_nan(c.region(buf), flags[idx])
    op.part_done()
