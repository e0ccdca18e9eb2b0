"""The outer collective of one fragment: every rank's outer gradients in, their mean out, the
same bits on every rank.

- Uncompressed (no tensor of the fragment has a compressing codec): the outer gradients,
  flattened into one float32 buffer, are summed with one ``all_reduce`` and divided by the
  number of ranks: the baseline, what DiLoCo without compression sends.
- Compressed: each tensor's outer gradient is encoded (:class:`~hipress.diloco.coder.OuterCoder`)
  into its slot of one message, followed by a trailer of one non-finite flag byte per tensor
  (padded to 8 bytes, so every slot stays 8-byte aligned as the kernels need); one
  all-gather delivers every rank's message to every rank, and each rank decodes
  the N payloads of each tensor in rank order and divides by N
  (:func:`~hipress.codec.algorithm.decode_mean`). A NaN/Inf on any rank makes that tensor's
  mean all-NaN on every rank.

:meth:`FragmentSync.start` issues the collective of the outer gradients written into
:attr:`FragmentSync.views` asynchronously and returns a :class:`Pending`;
:meth:`FragmentSync.finish` waits for it and returns the means. A failed collective (a peer that
died, a timeout) raises :class:`~hipress.codec.errors.CommError`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from hipress.codec.algorithm import decode_mean
from hipress.codec.flags import FlagMode
from hipress.core.compression import compresses
from hipress.core.release import InFlight
from hipress.diloco.coder import OuterCoder
from hipress.diloco.errors import CommError

__all__ = ["FragmentSync", "Pending", "guarded"]

T = TypeVar("T")
# torch 2.13 renames all_gather_into_tensor (kept, deprecated); older releases have only that
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def guarded(what: str, fn: Callable[[], T]) -> T:
    """``fn()``, a failed collective raised as :class:`CommError` saying ``what`` failed."""
    try:
        return fn()
    except RuntimeError as exc:
        raise CommError(
            f"DiLoCo: {what} failed: {exc}\nA peer died or the process group timed out; end "
            "every worker and resume all of them from the last checkpoint"
        ) from exc


@dataclass
class Pending:
    """A fragment's outer collective in flight: the buffer it fills and its ``work`` (None
    once complete, e.g. after a checkpoint waited for it)."""

    buffer: torch.Tensor
    work: InFlight | None = None

    def wait(self, what: str) -> None:
        """Wait for the collective (``what`` names it in a :class:`CommError`)."""
        if self.work is not None:
            work, self.work = self.work, None
            work.wait(lambda fn: guarded(what, fn))


class FragmentSync:
    """Averages the outer gradients of one fragment's tensors (``numels``, each on ``device``)
    over ``group``, tensor ``i`` with ``coders[i]`` (its codec may be
    :class:`~hipress.core.compression.Uncompressed`).

    Fields: ``compressed`` (whether the fragment sends payloads), ``message_nbytes`` (bytes each
    rank sends per sync: the message, or the float32 buffer), ``size`` (ranks in ``group``),
    ``views`` (one flat float32 view per tensor: where the caller writes the outer gradients
    before :meth:`start`).
    """

    def __init__(
        self,
        numels: Sequence[int],
        coders: Sequence[OuterCoder],
        device: torch.device,
        group: Any,
    ) -> None:
        self.numels, self.coders = list(numels), list(coders)
        self.device, self.group = device, group
        self.size = dist.get_world_size(group)
        # the outer gradients are written here (one buffer, reused by every sync: no
        # allocation, no page faults, and the uncompressed all-reduce needs no concatenation)
        self.flat = torch.empty(sum(self.numels), dtype=torch.float32, device=device)
        self.views = list(self.flat.split(self.numels))
        self.compressed = any(compresses(c.alg) for c in coders)
        if self.compressed:
            self.offsets, off = [], 0
            for c in self.coders:
                self.offsets.append(off)
                off += c.nbytes
            self.trailer = off
            self.message_nbytes = off + (len(coders) + 7) // 8 * 8
        else:
            self.message_nbytes = 4 * sum(self.numels)

    def start(self, what: str) -> Pending:
        """Issue the collective of the outer gradients held in :attr:`views` (``what`` names
        the sync in errors). Uncompressed, the all-reduce runs in place on their buffer, which
        stays in use until :meth:`finish`."""
        if not self.compressed:
            buf = self.flat
            return self._issue(what, buf, lambda: dist.all_reduce(
                buf, group=self.group, async_op=True), [buf])  # fmt: skip
        mine = torch.empty(self.message_nbytes, dtype=torch.uint8, device=self.device)
        mode = FlagMode.for_tensor(mine)
        flags = []
        for g, c, off in zip(self.views, self.coders, self.offsets, strict=True):
            flags.append(c.encode(g, mine[off : off + c.nbytes], mode))
        FlagMode.write(mine[self.trailer :], flags)
        got = torch.empty(self.size * self.message_nbytes, dtype=torch.uint8, device=self.device)
        return self._issue(what, got, lambda: _ALL_GATHER(
            got, mine, group=self.group, async_op=True), [got, mine])  # fmt: skip

    @staticmethod
    def _issue(what: str, buffer: torch.Tensor, launch: Callable[[], Any],
               tensors: list[torch.Tensor]) -> Pending:  # fmt: skip
        """Issue ``launch()`` (an async collective on ``tensors`` filling ``buffer``; a failure
        raised as :class:`CommError` naming ``what``)."""
        return Pending(buffer, InFlight(lambda: guarded(what, launch), tensors))

    def finish(self, p: Pending, what: str) -> list[torch.Tensor]:
        """Wait for ``p`` and return the mean outer gradient of each tensor (flat float32), the
        same bits on every rank: views of this sync's buffer, valid until its next :meth:`start`
        (which writes the next outer gradients there)."""
        p.wait(what)
        if not self.compressed:
            return list(p.buffer.div_(self.size).split(self.numels))
        rows = p.buffer.view(self.size, self.message_nbytes)
        mode = FlagMode.for_tensor(rows)
        flags = mode.gathered(rows, self.trailer, len(self.coders))
        out = []
        # the means go where the outer gradients were (encoded at start, no longer needed): a
        # fresh buffer each sync would cost a page fault per 4 KiB, more than the decode itself
        for c, off, n, bad, mean in zip(self.coders, self.offsets, self.numels, flags,
                                        self.views, strict=True):  # fmt: skip
            decode_mean(c.alg, [rows[r, off : off + c.nbytes] for r in range(self.size)], n, mean)
            FlagMode.fill_nan(mean, bad)
            out.append(mean)
        return out

    def received_nbytes(self) -> int:
        """Bytes of the buffer a sync fills (what a checkpoint keeps of a sync in flight)."""
        return self.message_nbytes * (self.size if self.compressed else 1)

    def wire_bytes(self) -> int:
        """Bytes one rank sends per sync on a ring: an all-reduce sends 2(N-1)/N of the buffer,
        an all-gather (N-1)/N of the gathered messages, i.e. (N-1) messages."""
        n = self.size
        if not self.compressed:
            return 2 * (n - 1) * self.message_nbytes // max(1, n)
        return (n - 1) * self.message_nbytes
