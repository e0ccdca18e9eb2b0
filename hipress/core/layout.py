"""The layout of a compressed tensor's chunks, derived once per plan entry and passed down.

A compressed parameter is split into its plan's K partitions ("chunks"); under PS and RING each
chunk is split again into N shards, each encoded on its own. A :class:`ChunkLayout` holds
everything static about one chunk: where it starts in the tensor, its shards, each shard's
payload size, and the keys of the algorithm states that encode it. CaSync's bucket schedule,
its state initialisation, the Horovod wrapper and the reference model all read these instead
of splitting sizes themselves.

Every figure is a static function of the tensor size, the plan entry, N and the codec's
``payload_nbytes``: ranks agree on it without exchanging anything.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from hipress.core.plan import Plan, PlanError, Strategy, TensorPlan

__all__ = [
    "ChunkLayout",
    "PlanLayout",
    "chunk_key",
    "layout_plan",
    "layout_tensor",
    "split_sizes",
]

PayloadSize = Callable[[int], int]
_SHARDED = (Strategy.PS, Strategy.RING)


def split_sizes(n: int, parts: int) -> tuple[int, ...]:
    """Split ``n`` elements into ``parts`` contiguous pieces as equal as possible (the first
    ``n % parts`` get one more)."""
    base, extra = divmod(n, parts)
    return tuple(base + (1 if i < extra else 0) for i in range(parts))


def chunk_key(
    name: str, part: int, parts: int, shard: int | None = None, server: bool = False
) -> str:
    """The state key of one compressed unit of parameter ``name``.

    A unit is partition ``part`` of ``parts`` (ALLGATHER), or shard ``shard`` of that partition
    (PS and RING, where every shard is encoded on its own). Worker-side states (``server=False``)
    compress the worker's own gradient (RING: plus the partial sum it received); server-side
    states (PS, RING) re-compress the aggregate of the shard the worker serves.
    """
    key = f"{name}#{part}/{parts}"
    if shard is not None:
        key += f".{shard}"
    return key + ("@server" if server else "")


@dataclass(frozen=True)
class ChunkLayout:
    """Partition ``part`` of ``parts`` of compressed parameter ``name``.

    Fields:
        name: parameter name.
        part, parts: partition index k and count K.
        start: first element of the chunk in the parameter.
        numel: element count.
        strategy: ALLGATHER, PS or RING.
        shards: PS and RING: element counts of the N shards (contiguous, in order); else ``()``.
        shard_starts: element offset of each shard inside the chunk.
        payloads: payload bytes of each shard (PS, RING) or of the whole chunk (ALLGATHER: one).
        slot: the largest of ``payloads``: bytes reserved for one payload of the chunk.
    """

    name: str
    part: int
    parts: int
    start: int
    numel: int
    strategy: Strategy
    shards: tuple[int, ...]
    shard_starts: tuple[int, ...]
    payloads: tuple[int, ...]
    slot: int

    @property
    def key(self) -> str:
        """The chunk's own :func:`chunk_key` (ALLGATHER's state; PS and Horovod message names)."""
        return chunk_key(self.name, self.part, self.parts)

    def shard_key(self, j: int, server: bool = False) -> str:
        """The state key of shard ``j`` (worker side, or the server's)."""
        return chunk_key(self.name, self.part, self.parts, shard=j, server=server)

    def shard_offset(self, j: int) -> int:
        """Element offset of shard ``j`` inside the chunk."""
        return self.shard_starts[j]

    def shard_span(self, j: int) -> tuple[int, int]:
        """``(start, stop)`` of shard ``j`` inside the chunk."""
        return self.shard_starts[j], self.shard_starts[j] + self.shards[j]

    def states(self, rank: int, world_size: int) -> Iterator[tuple[str, int, bool]]:
        """``(key, numel, server)`` of every state rank ``rank`` keeps for this chunk: one worker
        state (ALLGATHER), one per shard (PS; RING: but ``rank``'s own, which is only encoded as
        the aggregate), and the server state of shard ``rank`` (PS, RING)."""
        if self.strategy is Strategy.ALLGATHER:
            yield self.key, self.numel, False
            return
        for j, s in enumerate(self.shards):
            if self.strategy is Strategy.RING and j == rank:
                continue
            yield self.shard_key(j), s, False
        yield self.shard_key(rank, server=True), self.shards[rank], True


def _chunk(
    e: TensorPlan, k: int, start: int, size: int, world_size: int, payload_nbytes: PayloadSize
) -> ChunkLayout:
    if e.strategy in _SHARDED:
        if size < world_size:
            raise PlanError(f"{e.name}: partition of {size} elements < {world_size} shards")
        shards = split_sizes(size, world_size)
        starts = tuple(sum(shards[:j]) for j in range(len(shards)))
        sizes = {s: payload_nbytes(s) for s in set(shards)}
        payloads = tuple(sizes[s] for s in shards)
    else:
        if size < 1:
            raise PlanError(f"{e.name}: empty partition")
        shards, starts, payloads = (), (), (payload_nbytes(size),)
    slot = max(payloads)
    if any(p % 8 for p in payloads):
        raise PlanError(f"payload_nbytes must be a multiple of 8, got {slot}")
    return ChunkLayout(e.name, k, e.partitions, start, size, e.strategy, shards, starts,
                       payloads, slot)  # fmt: skip


def layout_tensor(
    entry: TensorPlan, world_size: int, payload_nbytes: PayloadSize | None
) -> tuple[ChunkLayout, ...]:
    """The chunks of ``entry`` among ``world_size`` workers, in order (``()`` when it is not
    compressed). ``payload_nbytes`` is the codec's static payload size (``None``: no codec).
    Raises :class:`PlanError` (a ``ValueError``) if the entry is compressed without a codec, a
    chunk is too small for its strategy or a payload size is not a multiple of 8."""
    if not entry.compress or entry.row_bound:  # (row-sparse: hipress.casync.rowsparse)
        return ()
    if payload_nbytes is None:
        raise PlanError(f"{entry.name} is compressed but no algorithm was given")
    out, start = [], 0
    for k, size in enumerate(split_sizes(entry.numel, entry.partitions)):
        out.append(_chunk(entry, k, start, size, world_size, payload_nbytes))
        start += size
    return tuple(out)


@dataclass(frozen=True)
class PlanLayout:
    """The chunks of every entry of one plan, for one world size and codec.

    Fields:
        plan: the plan laid out.
        world_size: N.
        chunks: parameter name -> its chunks (``()`` for an uncompressed one).
    """

    plan: Plan
    world_size: int
    chunks: Mapping[str, tuple[ChunkLayout, ...]]

    def __getitem__(self, name: str) -> tuple[ChunkLayout, ...]:
        return self.chunks[name]

    def all_chunks(self) -> Iterator[ChunkLayout]:
        """Every chunk, in plan order."""
        for e in self.plan.entries:
            yield from self.chunks[e.name]


def layout_plan(plan: Plan, world_size: int, payload_nbytes: PayloadSize | None) -> PlanLayout:
    """Lay out every entry of ``plan`` (see :func:`layout_tensor`); raises :class:`PlanError`."""
    chunks = {e.name: layout_tensor(e, world_size, payload_nbytes) for e in plan.entries}
    return PlanLayout(plan, world_size, chunks)
