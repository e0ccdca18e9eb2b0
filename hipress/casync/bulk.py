"""Bulk synchronisation: the static layout of one bucket's messages.

A bucket holds several parameters, laid out one after another in a flat buffer. Each parameter is
split into its plan's K partitions ("chunks"). Chunks are batched into rounds: round ``r`` of a
strategy carries partition ``r`` of every tensor of that strategy in the bucket, so many small
tensors share one collective, and a tensor with K partitions is spread over K pipelined rounds.

A round's message is a block of bytes per worker, identical in layout on every rank:

    [slot of chunk 0][slot of chunk 1]...[non-finite flags, one byte per chunk, padded to 8]

- ALLGATHER: a chunk's slot holds its payload; the block is all-gathered.
- PS: a chunk is split into N shards; the block sent to worker j holds every chunk's shard j
  (all_to_all), and the block worker j all-gathers holds its re-encoded aggregate of shard j. A
  slot is sized for the largest shard, so all blocks have one size ``B``.
- RING: shards as in PS; each hop sends one block: shard s of every chunk (a partial sum, later
  the aggregate), see :mod:`hipress.casync.strategies.ring`.

:class:`Workspace` holds the message buffers of one layout, allocated once and reused.

Every size here is a static function of the parameter sizes, the plan, N and the algorithm's
``payload_nbytes``: ranks agree on it without exchanging anything. Payload sizes are multiples of
8, so slots stay 8-byte aligned.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch

from hipress.codec.flags import Flag, FlagMode
from hipress.core.layout import ChunkLayout, layout_tensor
from hipress.core.plan import Strategy, TensorPlan

__all__ = ["BucketSchedule", "Chunk", "Round", "Workspace", "build_schedule", "schedule_bucket"]


def _round8(n: int) -> int:
    return (n + 7) // 8 * 8


@dataclass(frozen=True)
class Chunk:
    """A chunk (its :class:`~hipress.core.layout.ChunkLayout`) placed in a bucket buffer.

    Fields:
        layout: the chunk's layout (shards, payload sizes, state keys).
        offset: first element of the chunk in the bucket buffer.
    """

    layout: ChunkLayout
    offset: int

    @property
    def name(self) -> str:
        return self.layout.name

    @property
    def part(self) -> int:
        return self.layout.part

    @property
    def parts(self) -> int:
        return self.layout.parts

    @property
    def numel(self) -> int:
        return self.layout.numel

    @property
    def shards(self) -> tuple[int, ...]:
        return self.layout.shards

    @property
    def slot(self) -> int:
        """Bytes reserved for the chunk's payload (PS, RING: one shard's) in a block."""
        return self.layout.slot

    def shard_offset(self, j: int) -> int:
        """Element offset of shard ``j`` inside the chunk."""
        return self.layout.shard_starts[j]

    def shard_region(self, buffer: torch.Tensor, j: int) -> torch.Tensor:
        """Shard ``j`` of this chunk in the bucket ``buffer``."""
        start = self.offset + self.layout.shard_starts[j]
        return buffer[start : start + self.layout.shards[j]]

    def region(self, buffer: torch.Tensor) -> torch.Tensor:
        """This chunk in the bucket ``buffer``."""
        return buffer[self.offset : self.offset + self.layout.numel]


@dataclass(frozen=True)
class Round:
    """One batched collective round: chunks of one strategy sharing one message.

    Fields:
        strategy: ALLGATHER, PS or RING.
        chunks: the chunks it carries, in bucket order.
        slot_offsets: byte offset of each chunk's slot inside a block.
        flags_offset: byte offset of the non-finite flags (one byte per chunk).
        block_nbytes: B, the bytes of one worker's block (a multiple of 8).
    """

    strategy: Strategy
    chunks: tuple[Chunk, ...]
    slot_offsets: tuple[int, ...]
    flags_offset: int
    block_nbytes: int

    def slots(self) -> Iterator[tuple[int, Chunk, int]]:
        """(index, chunk, slot byte offset) of every chunk, in order."""
        for idx, (c, off) in enumerate(zip(self.chunks, self.slot_offsets, strict=True)):
            yield idx, c, off

    def write_flags(self, blocks: torch.Tensor, flags: Sequence[Flag]) -> None:
        """Write the chunks' non-finite ``flags`` into one block (or each row of ``blocks``)."""
        FlagMode.write(blocks[..., self.flags_offset :], flags)

    def read_flags(self, mode: FlagMode, blocks: torch.Tensor) -> list[Flag]:
        """The chunks' flags of the blocks in the rows of ``blocks``, ORed over the rows."""
        return mode.gathered(blocks, self.flags_offset, len(self.chunks))

    def read_block_flags(self, mode: FlagMode, block: torch.Tensor) -> list[Flag]:
        """The chunks' flags in one ``block``."""
        return mode.read(block[self.flags_offset : self.flags_offset + len(self.chunks)])

    @property
    def max_chunk_numel(self) -> int:
        return max(c.numel for c in self.chunks)

    @property
    def max_shard_numel(self) -> int:
        return max((max(c.shards) for c in self.chunks if c.shards), default=0)


@dataclass(frozen=True)
class BucketSchedule:
    """Everything static about synchronising one bucket layout.

    Fields:
        names: parameter names in bucket order.
        numel: elements in the bucket buffer.
        allreduce_ranges: coalesced (offset, numel) element ranges sent uncompressed.
        rounds: the compressed rounds, ALLGATHER rounds first, then PS, then RING rounds, each by
            partition.
        sparse: (element offset, plan entry) of each row-sparse tensor
            (:mod:`hipress.casync.strategies.rowsparse`), in bucket order.
    """

    names: tuple[str, ...]
    numel: int
    allreduce_ranges: tuple[tuple[int, int], ...]
    rounds: tuple[Round, ...]
    sparse: tuple[tuple[int, TensorPlan], ...] = ()

    @property
    def allreduce_numel(self) -> int:
        return sum(n for _, n in self.allreduce_ranges)

    def chunks(self) -> list[Chunk]:
        return [c for r in self.rounds for c in r.chunks]


def _make_round(strategy: Strategy, chunks: list[Chunk]) -> Round:
    offsets, pos = [], 0
    for c in chunks:
        offsets.append(pos)
        pos += c.slot
    flags_offset = pos
    return Round(strategy, tuple(chunks), tuple(offsets), flags_offset, _round8(pos + len(chunks)))


def build_schedule(
    names: Sequence[str],
    numels: Sequence[int],
    decisions: Sequence[TensorPlan],
    world_size: int,
    payload_nbytes: Callable[[int], int] | None,
) -> BucketSchedule:
    """Lay out a bucket whose parameters ``names`` (sizes ``numels``, in buffer order) are
    synchronised as ``decisions`` say among ``world_size`` workers.

    ``payload_nbytes`` is the algorithm's static payload size (``None`` when nothing is
    compressed). Returns the schedule; raises ``ValueError`` (a
    :class:`~hipress.core.plan.PlanError`) if a payload size is not a multiple of 8 or a chunk
    is too small for its strategy.
    """
    chunks = {d.name: layout_tensor(d, world_size, payload_nbytes) for d in decisions}
    return schedule_bucket(names, numels, decisions, chunks)


def schedule_bucket(
    names: Sequence[str],
    numels: Sequence[int],
    decisions: Sequence[TensorPlan],
    chunks: Mapping[str, tuple[ChunkLayout, ...]],
) -> BucketSchedule:
    """The schedule of a bucket holding ``names`` (sizes ``numels``, decisions ``decisions``,
    in buffer order) whose compressed tensors are laid out as ``chunks`` says (by name, e.g. a
    :class:`~hipress.core.layout.PlanLayout`). Round ``k`` of a strategy carries chunk ``k`` of
    each of its tensors."""
    ranges: list[tuple[int, int]] = []
    order = (Strategy.ALLGATHER, Strategy.PS, Strategy.RING)
    by_strategy: dict[Strategy, list[list[Chunk]]] = {s: [] for s in order}
    sparse: list[tuple[int, TensorPlan]] = []
    offset = 0
    for name, numel, d in zip(names, numels, decisions, strict=True):
        if d.row_bound:
            sparse.append((offset, d))
        elif not d.compress:
            if ranges and ranges[-1][0] + ranges[-1][1] == offset:
                ranges[-1] = (ranges[-1][0], ranges[-1][1] + numel)
            else:
                ranges.append((offset, numel))
        else:
            rounds = by_strategy[d.strategy]
            for k, c in enumerate(chunks[name]):
                while len(rounds) <= k:
                    rounds.append([])
                rounds[k].append(Chunk(c, offset + c.start))
        offset += numel
    built = [_make_round(s, cs) for s in order for cs in by_strategy[s]]
    return BucketSchedule(tuple(names), offset, tuple(ranges), tuple(built), tuple(sparse))


class Workspace:
    """Buffers reused by every synchronisation of one bucket layout, allocated once.

    ``busy`` is True while a synchronisation uses them (one at a time per layout).

    Per round: ``send`` and ``recv`` message buffers (compressed size; for PS the all_to_all's
    send buffer is reused as the all-gather's output; RING uses ``recv`` alone) and a float32
    ``scratch`` (PS and RING: the largest shard, for merging; ALLGATHER: the largest chunk, only
    when the bucket is not float32). Plus ``allreduce``: a staging buffer when the uncompressed
    tensors are not one contiguous range.
    """

    def __init__(
        self, schedule: BucketSchedule, world_size: int, device: torch.device, dtype: torch.dtype
    ) -> None:
        n = world_size

        def u8(size: int) -> torch.Tensor:
            # zeros, not empty: slot padding goes on the wire and must be deterministic
            return torch.zeros(size, dtype=torch.uint8, device=device)

        def f32(size: int) -> torch.Tensor:
            return torch.empty(size, dtype=torch.float32, device=device)

        self.send: list[torch.Tensor] = []
        self.recv: list[torch.Tensor] = []
        self.scratch: list[torch.Tensor] = []
        for rnd in schedule.rounds:
            b = rnd.block_nbytes
            if rnd.strategy is Strategy.PS:
                self.send.append(u8(n * b))
                self.scratch.append(f32(rnd.max_shard_numel))
            elif rnd.strategy is Strategy.RING:
                self.send.append(u8(0))  # the ring sends out of its N blocks in ``recv``
                self.scratch.append(f32(rnd.max_shard_numel))
            else:
                self.send.append(u8(b))
                self.scratch.append(f32(rnd.max_chunk_numel if dtype != torch.float32 else 0))
            self.recv.append(u8(n * b))
        staged = len(schedule.allreduce_ranges) > 1
        self.allreduce = torch.empty(
            schedule.allreduce_numel if staged else 0, dtype=dtype, device=device
        )
        self.busy = False
