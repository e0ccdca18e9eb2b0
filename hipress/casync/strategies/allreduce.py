"""The uncompressed tensors of a bucket: one allreduce over their (coalesced) ranges."""

from __future__ import annotations

import torch
import torch.distributed as dist

from hipress.casync.strategies.surface import Operation

__all__ = ["start"]


def start(op: Operation, group: dist.ProcessGroup | None) -> None:
    """Issue the allreduce of ``op``'s uncompressed ranges (staged into one buffer when there
    are several), divided by N first, like DDP, so low-precision sums do not overflow."""
    ranges, buf = op.schedule.allreduce_ranges, op.buffer
    if len(ranges) == 1:
        off, n = ranges[0]
        flat = buf[off : off + n]
    else:
        flat = op.staging
        pos = 0
        with op.ctx.stats.phase("copy"):
            for off, n in ranges:
                flat[pos : pos + n].copy_(buf[off : off + n])
                pos += n
    flat.div_(op.ctx.world_size)
    op.issue(
        lambda: dist.all_reduce(flat, group=group, async_op=True),
        flat.numel() * flat.element_size(), "allreduce", _finish, op, flat,
    )  # fmt: skip


def _finish(op: Operation, flat: torch.Tensor) -> None:
    """The allreduce arrived: copy staged ranges back."""
    ranges = op.schedule.allreduce_ranges
    if len(ranges) > 1:
        pos = 0
        with op.ctx.stats.phase("copy"):
            for off, n in ranges:
                op.buffer[off : off + n].copy_(flat[pos : pos + n])
                pos += n
    op.part_done()
