"""Compressed all-reduce across replicas, for hierarchical data parallelism: FSDP2 shards each
unit inside a group of ranks (fast links, e.g. one node), and :class:`ReplicaAllReduce`,
installed with ``FSDPModule.set_all_reduce_hook``, averages each reduced shard across the
replicas of that group (slow links, between nodes), compressed.

Every rank encodes its reduced shard with its unit's state, the payloads are all-gathered over
the replica group, and each rank decodes and sums all of them in rank order, divided by the
replica count: every replica computes the same bits, so the replicas' parameters stay equal.
A NaN/Inf on any replica makes the whole shard NaN on all of them (the 8-byte trailer of each
payload holds the flag). Runs on the stream FSDP2 calls the hook on, with no read back.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from hipress.codec.algorithm import chunk_tensor_id, rank_seed
from hipress.codec.flags import FlagMode
from hipress.core.compression import CompressionAlgorithm
from hipress.core.layout import chunk_key
from hipress.fsdp.collective import TRAILER, UnitStats, decode_sum
from hipress.fsdp.errors import FsdpError
from hipress.fsdp.feedback import ChunkCoder, make_coder

__all__ = ["ReplicaAllReduce"]


class ReplicaAllReduce:
    """The all-reduce hook of one unit: average this rank's reduced shard of ``numel``
    elements over ``group`` (the replicas), compressed with ``algorithm`` when ``compress``
    (else a plain all-reduce). ``feedback`` is a resolved option; the state of shard ``shard``
    (this rank's index in its shard group) is keyed ``<unit>#0/1.<shard>@replica``."""

    def __init__(
        self,
        unit: str,
        algorithm: CompressionAlgorithm,
        feedback: str,
        numel: int,
        group: dist.ProcessGroup,
        shard: int,
        device: torch.device,
        compress: bool = True,
        seed: int = 0,
    ) -> None:
        self.unit, self.algorithm, self.numel, self.group = unit, algorithm, numel, group
        self.replicas, self.compress = group.size(), compress
        self.stats = UnitStats()
        self.coder: ChunkCoder | None = None
        if compress:
            key = chunk_key(unit, 0, 1, shard=shard) + "@replica"
            self.coder = make_coder(algorithm, feedback, numel, torch.device(device),
                                    rank_seed(seed, group.rank()), chunk_tensor_id(key))  # fmt: skip
            self.block = algorithm.payload_nbytes(numel) + TRAILER

    def __call__(self, shard: torch.Tensor) -> None:
        """Replace ``shard`` (this rank's reduced gradient shard) by its mean over the
        replicas. Raises :class:`FsdpError` if its size is not this unit's."""
        if shard.numel() != self.numel or not shard.is_contiguous():
            raise FsdpError(
                f"{self.unit}: the all-reduce hook was set up for {self.numel} elements, got "
                f"{shard.numel()}; register again after changing the model"
            )
        r = self.replicas
        self.stats.calls += 1
        self.stats.raw_bytes += 2 * (r - 1) * shard.numel() * shard.element_size() // r
        if self.coder is None:
            dist.all_reduce(shard, group=self.group)
            shard.div_(r)
            self.stats.sent_bytes += 2 * (r - 1) * shard.numel() * shard.element_size() // r
            return
        mode = FlagMode.for_tensor(shard)
        nbytes = self.block - TRAILER
        mine = torch.empty(self.block, dtype=torch.uint8, device=shard.device)
        flag = self.coder.encode(shard.view(-1), mine[:nbytes], mode)
        FlagMode.write(mine[nbytes:], [flag])
        got = torch.empty(r * self.block, dtype=torch.uint8, device=shard.device)
        dist.all_gather_into_tensor(got, mine, group=self.group)
        blocks = got.view(r, self.block)
        bad = mode.gathered(blocks, nbytes, 1)[0]
        decode_sum(self.algorithm, [blocks[i, :nbytes] for i in range(r)], self.numel,
                   shard.view(-1), float(r))  # fmt: skip
        FlagMode.fill_nan(shard, bad)
        self.stats.compressed_calls += 1
        self.stats.sent_bytes += self.block
        if bad is True:
            self.stats.nonfinite += 1

    def feedback_bytes(self) -> int:
        return 0 if self.coder is None else self.coder.feedback_bytes()

    def state_bytes(self) -> int:
        return 0 if self.coder is None else self.coder.state_bytes()

    def state_dict(self) -> dict[str, Any]:
        return {} if self.coder is None else {"replica": self.coder.state_dict()}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        if self.coder is None:
            return
        if "replica" not in sd:
            raise FsdpError(f"{self.unit}: the checkpoint holds no replica state")
        self.coder.load_state_dict(sd["replica"])
