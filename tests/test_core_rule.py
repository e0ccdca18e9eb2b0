"""The plan rule used when no plan is given (hipress.core.rule)."""

from __future__ import annotations

import pytest

from hipress.core.plan import Strategy
from hipress.core.rule import DefaultRule


def test_small_tensors_stay_uncompressed_and_large_ones_are_partitioned() -> None:
    rule = DefaultRule(min_compress_numel=100, partition_numel=1000, max_partitions=3)
    small = rule.entry("b", 99, 4)
    assert (small.compress, small.strategy, small.partitions) == (False, Strategy.ALLREDUCE, 1)
    assert rule.entry("w", 2500, 4).partitions == 3  # ceil(2500 / 1000)
    assert rule.entry("w", 10**6, 4).partitions == 3  # at most max_partitions
    assert rule.entry("w", 10**6, 4).strategy is Strategy.PS


def test_two_workers_use_the_allgather_and_every_partition_keeps_a_shard() -> None:
    rule = DefaultRule(min_compress_numel=1, partition_numel=1, max_partitions=8)
    assert rule.entry("w", 100, 2).strategy is Strategy.ALLGATHER
    assert rule.entry("w", 12, 4).partitions == 3  # numel // world_size
    assert not rule.entry("w", 3, 4).compress  # fewer elements than workers


@pytest.mark.parametrize("field", ["min_compress_numel", "partition_numel", "max_partitions"])
def test_fields_must_be_positive(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        DefaultRule(**{field: 0})
