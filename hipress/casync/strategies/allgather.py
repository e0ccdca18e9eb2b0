"""The compressed all-gather: every worker encodes each chunk of the round, the blocks are
all-gathered, and every worker decodes the N payloads of each chunk and averages them."""

from __future__ import annotations

import torch.distributed as dist

from hipress.casync.strategies.context import all_gather
from hipress.casync.strategies.surface import Operation, RoundIO
from hipress.codec.algorithm import decode_mean
from hipress.codec.flags import Flag, FlagMode

__all__ = ["start"]


def start(op: Operation, io: RoundIO, group: dist.ProcessGroup | None) -> None:
    """Encode the round's chunks into its block (with their flags) and all-gather it."""
    ctx, buf, rnd, send = op.ctx, op.buffer, io.round, io.send
    with ctx.stats.timed("encode_ms"):
        flags: list[Flag] = []
        for _, c, off in rnd.slots():
            state = ctx.worker_states[c.layout.key]
            flags.append(op.encode(c.region(buf), state, send[off : off + c.slot]))
            FlagMode.reset(state, flags[-1])
        rnd.write_flags(send, flags)
    op.issue(
        lambda: all_gather(io.recv, send, group=group, async_op=True),
        send.numel(), "allgather", _finish, op, io,
    )  # fmt: skip


def _finish(op: Operation, io: RoundIO) -> None:
    """Every block arrived: decode and average each chunk (all-NaN where a rank flagged it)."""
    ctx, alg, buf, n = op.ctx, op.ctx.algorithm, op.buffer, op.ctx.world_size
    rnd = io.round
    with ctx.stats.timed("decode_ms"):
        blocks = io.recv.view(n, rnd.block_nbytes)
        flags = rnd.read_flags(op.flags, blocks)
        for idx, c, off in rnd.slots():
            region = c.region(buf)
            if flags[idx] is True:
                region.fill_(float("nan"))
                continue
            payloads = [blocks[r, off : off + c.slot] for r in range(n)]
            ctx.decode_into(region, io.scratch, decode_mean, alg, payloads, c.numel)
            FlagMode.fill_nan(region, flags[idx])
    op.part_done()
