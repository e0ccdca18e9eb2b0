"""The static layout of a bucket's messages (hipress.casync.bulk)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hipress.casync.bulk import build_schedule
from hipress.core.layout import split_sizes
from hipress.core.plan import Strategy, TensorPlan

AG, PS, AR = Strategy.ALLGATHER, Strategy.PS, Strategy.ALLREDUCE


def _payload(n: int) -> int:
    """A codec with a 10-byte header and 2 bits per element, padded to 8 bytes."""
    return (10 + (2 * n + 7) // 8 + 7) // 8 * 8


def _decision(name: str, n: int, strategy: Strategy, k: int = 1) -> TensorPlan:
    return TensorPlan(name, n, strategy is not AR, strategy, k)


@given(st.integers(0, 10_000), st.integers(1, 64))
def test_split_sizes_cover_evenly(n: int, parts: int) -> None:
    sizes = split_sizes(n, parts)
    assert len(sizes) == parts and sum(sizes) == n
    assert max(sizes) - min(sizes) <= 1 and list(sizes) == sorted(sizes, reverse=True)


def test_rounds_batch_partitions_and_strategies() -> None:
    tensors = [("a", 1000, PS, 3), ("b", 37, AR, 1), ("c", 513, AG, 1), ("d", 9, AR, 1)]
    sched = build_schedule(
        [t[0] for t in tensors],
        [t[1] for t in tensors],
        [_decision(*t) for t in tensors],
        4,
        _payload,
    )
    assert sched.numel == 1559
    # the uncompressed tensors are not adjacent: two ranges, staged for one allreduce
    assert sched.allreduce_ranges == ((1000, 37), (1550, 9))
    strategies = [(r.strategy, [(c.name, c.part) for c in r.chunks]) for r in sched.rounds]
    assert strategies == [(AG, [("c", 0)]), (PS, [("a", 0)]), (PS, [("a", 1)]), (PS, [("a", 2)])]
    a0 = sched.rounds[1].chunks[0]
    assert (a0.offset, a0.numel, a0.shards) == (0, 334, (84, 84, 83, 83))
    assert a0.slot == _payload(84)
    a2 = sched.rounds[3].chunks[0]
    assert (a2.offset, a2.numel) == (334 + 333, 333)
    for rnd in sched.rounds:
        assert rnd.block_nbytes % 8 == 0
        assert all(off % 8 == 0 for off in rnd.slot_offsets)
        assert rnd.flags_offset + len(rnd.chunks) <= rnd.block_nbytes


def test_many_small_tensors_share_one_round() -> None:
    n = 50
    sched = build_schedule(
        [f"t{i}" for i in range(n)],
        [100] * n,
        [_decision(f"t{i}", 100, AG) for i in range(n)],
        2,
        _payload,
    )
    assert len(sched.rounds) == 1 and len(sched.rounds[0].chunks) == n
    assert sched.rounds[0].slot_offsets[1] == _payload(100)
    assert sched.rounds[0].block_nbytes == n * _payload(100) + 56  # 50 flags padded to 56


def test_uncompressed_bucket_is_one_range() -> None:
    sched = build_schedule(
        ["a", "b"], [5, 7], [_decision("a", 5, AR), _decision("b", 7, AR)], 2, None
    )
    assert sched.allreduce_ranges == ((0, 12),) and sched.rounds == ()


def test_bad_layouts_are_refused() -> None:
    with pytest.raises(ValueError, match="no algorithm"):
        build_schedule(["a"], [100], [_decision("a", 100, PS)], 2, None)
    with pytest.raises(ValueError, match="shards"):
        build_schedule(["a"], [3], [_decision("a", 3, PS)], 4, _payload)
    with pytest.raises(ValueError, match="multiple of 8"):
        build_schedule(["a"], [100], [_decision("a", 100, AG)], 2, lambda n: n + 1)
