"""The layout of a compressed tensor's chunks (hipress.core.layout) and the Uncompressed codec
(hipress.core.compression)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from hipress.core import (
    CompressionAlgorithm,
    Plan,
    PlanError,
    Strategy,
    TensorPlan,
    Uncompressed,
    chunk_key,
    compresses,
    layout_plan,
    layout_tensor,
)

AG, PS, RING, AR = Strategy.ALLGATHER, Strategy.PS, Strategy.RING, Strategy.ALLREDUCE


def _payload(n: int) -> int:
    return (10 + (2 * n + 7) // 8 + 7) // 8 * 8


@given(
    st.integers(1, 5000),
    st.integers(1, 6),
    st.integers(1, 8),
    st.sampled_from([AG, PS, RING]),
)
def test_chunks_and_shards_tile_the_tensor(numel: int, parts: int, world: int, s: Strategy) -> None:
    e = TensorPlan("w", numel, True, s, parts)
    sharded = s in (PS, RING)
    if numel // parts < (world if sharded else 1):
        with pytest.raises(PlanError):
            layout_tensor(e, world, _payload)
        return
    chunks = layout_tensor(e, world, _payload)
    assert [c.part for c in chunks] == list(range(parts))
    assert sum(c.numel for c in chunks) == numel
    assert [c.start for c in chunks] == [sum(x.numel for x in chunks[:k]) for k in range(parts)]
    for c in chunks:
        assert c.slot == max(c.payloads) and c.slot % 8 == 0
        if not sharded:
            assert c.shards == () and c.payloads == (_payload(c.numel),)
            continue
        assert len(c.shards) == world and sum(c.shards) == c.numel
        assert c.payloads == tuple(_payload(x) for x in c.shards)
        for j in range(world):
            lo, hi = c.shard_span(j)
            assert hi - lo == c.shards[j] and lo == sum(c.shards[:j])


def test_states_per_rank_follow_the_strategy() -> None:
    (ag,) = layout_tensor(TensorPlan("a", 100, True, AG), 3, _payload)
    (ps,) = layout_tensor(TensorPlan("p", 100, True, PS), 3, _payload)
    (ring,) = layout_tensor(TensorPlan("r", 100, True, RING), 3, _payload)
    assert list(ag.states(1, 3)) == [(chunk_key("a", 0, 1), 100, False)]
    assert [k for k, _, _ in ps.states(1, 3)] == [
        "p#0/1.0", "p#0/1.1", "p#0/1.2", "p#0/1.1@server",
    ]  # fmt: skip
    # in a ring, a rank's own shard is encoded only as the aggregate
    assert [(k, n, srv) for k, n, srv in ring.states(1, 3)] == [
        ("r#0/1.0", 34, False), ("r#0/1.2", 33, False), ("r#0/1.1@server", 33, True),
    ]  # fmt: skip


def test_a_plan_is_laid_out_once_per_entry() -> None:
    plan = Plan("x", {}, 2, (TensorPlan("a", 10, False, AR), TensorPlan("b", 64, True, PS, 2)))
    layout = layout_plan(plan, 2, _payload)
    assert layout["a"] == () and len(layout["b"]) == 2
    assert [c.key for c in layout.all_chunks()] == ["b#0/2", "b#1/2"]
    with pytest.raises(PlanError, match="no algorithm"):
        layout_plan(plan, 2, None)


@pytest.mark.parametrize("n", [0, 1, 7, 1000])
def test_uncompressed_is_a_codec_that_keeps_the_values(n: int) -> None:
    codec = Uncompressed()
    assert isinstance(codec, CompressionAlgorithm) and not compresses(codec)
    assert codec == Uncompressed() and codec.digest == "none" and dict(codec.params) == {}
    g = torch.randn(n)
    state = codec.init_state(n)
    payload = codec.encode(g, state)
    assert payload.numel() == codec.payload_nbytes(n) and payload.numel() % 8 == 0
    assert state.step == 1
    assert torch.equal(codec.decode(payload, n), g)
    out = torch.ones(n)
    codec.decode(payload, n, out=out, accumulate=True)
    assert torch.equal(out, g + 1)
