"""The plan rule used when no plan is given: :class:`DefaultRule`.

Tensors of fewer than ``min_compress_numel`` elements are not compressed and go, batched, into one
allreduce per bucket; larger ones are compressed with the PS strategy (compressed scatter-reduce +
all-gather; between two workers the all-gather) in ``ceil(numel / partition_numel)`` partitions,
at most ``max_partitions``. The DDP hook, Horovod and FSDP read it alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hipress.core.plan import Strategy, TensorPlan

__all__ = ["DefaultRule"]


@dataclass(frozen=True)
class DefaultRule:
    """The plan used when none is given.

    Fields:
        min_compress_numel: tensors with fewer elements are sent uncompressed (batched).
        partition_numel: target elements per pipelined partition of a compressed tensor.
        max_partitions: upper bound on K.
    """

    min_compress_numel: int = 1 << 16
    partition_numel: int = 1 << 22
    max_partitions: int = 4

    def __post_init__(self) -> None:
        if self.min_compress_numel < 1:
            raise ValueError(f"min_compress_numel must be >= 1, got {self.min_compress_numel}")
        if self.partition_numel < 1:
            raise ValueError(f"partition_numel must be >= 1, got {self.partition_numel}")
        if self.max_partitions < 1:
            raise ValueError(f"max_partitions must be >= 1, got {self.max_partitions}")

    def entry(self, name: str, numel: int, world_size: int) -> TensorPlan:
        """The decision for one tensor of ``numel`` elements among ``world_size`` workers."""
        if numel < max(self.min_compress_numel, world_size):
            return TensorPlan(name, numel, compress=False, strategy=Strategy.ALLREDUCE)
        parts = min(self.max_partitions, math.ceil(numel / self.partition_numel))
        parts = max(1, min(parts, numel // world_size))
        # two workers: the all-gather sends the bytes the PS sends, in one phase, with one
        # encode per element instead of two (and no re-compression error)
        strategy = Strategy.ALLGATHER if world_size == 2 else Strategy.PS
        return TensorPlan(name, numel, compress=True, strategy=strategy, partitions=parts)
