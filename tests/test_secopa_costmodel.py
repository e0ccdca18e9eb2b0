"""The cost model: CaSync's strategies for every K, pipelining, batching into buckets, and the
original SeCoPa formulas as one configuration of the same evaluator."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hipress.secopa.model.costfn import AffineFloor
from hipress.secopa.model.costmodel import ORIGINAL_FORMULAS, CostModel, Member
from hipress.secopa.model.profile import (
    AlphaBeta,
    FittedComm,
    PayloadModel,
    Profile,
    affine_profile,
)

affine = st.tuples(st.floats(1e-9, 1e-5), st.floats(0.0, 0.2), st.floats(0.0, 0.2))


def _profile(overlap: float = 1.0, bw: float = 1.25e9, lat: float = 25e-6) -> Profile:
    return affine_profile(
        "terngrad",
        encode=(4e-7, 0.01, 0.01),
        decode=(2e-7, 0.005, 0.005),
        merge=(1e-7, 0.002, 0.002),
        bytes_per_element=0.25,
        header=16,
        bandwidth_bytes_per_s=bw,
        latency_s=lat,
        overlap=overlap,
    )


def _c(f: tuple[float, float, float], x: float) -> float:
    w, b, floor = f
    return max(floor, w * x + b)


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(2, 32),
    kf=st.floats(0.0, 1.0),
    m=st.integers(1 << 10, 1 << 26),
    r=st.sampled_from([1 / 32, 1 / 16, 1 / 8, 1 / 4]),
    enc=affine,
    dec=affine,
    merge=affine,
    gather=affine,
    bcast=affine,
    send=affine,
)
def test_original_formulas_are_one_configuration(
    n: int,
    kf: float,
    m: int,
    r: float,
    enc: tuple[float, float, float],
    dec: tuple[float, float, float],
    merge: tuple[float, float, float],
    gather: tuple[float, float, float],
    bcast: tuple[float, float, float],
    send: tuple[float, float, float],
) -> None:
    """The original HiPress formulas (docs/explanation/secopa.md), term by term, with every
    cost affine-with-floor in elements (the original's per-cluster fits); network ops take
    bytes, so w/4."""
    k = 1 + int(kf * (n - 1))
    base = affine_profile("x", encode=enc, decode=dec, merge=merge, bytes_per_element=4 * r)
    net = dict(base.network)
    for name, (w, b, fl) in (("gather", gather), ("bcast", bcast), ("send", send)):
        net[name] = FittedComm(AffineFloor(w / 4, b, fl))
    prof = Profile("x", {}, PayloadModel(4 * r, 0.0), base.compute, net)
    cm = CostModel(prof, n, ORIGINAL_FORMULAS)
    x, rx = m / k, r * m / k
    want = {
        "ps_plain": _c(gather, x) + _c(bcast, x) + (n - 1) * _c(merge, x),
        "ps_compressed": _c(gather, rx)
        + _c(bcast, rx)
        + min(k + 1, n) * _c(enc, x)
        + min(n - 1 + k, 2 * (n - 1)) * _c(dec, rx)
        + (n - 1) * _c(merge, x),
        "ring_plain": 2 * (n - 1) * _c(send, x) + (n - 1) * _c(merge, x),
        "ring_compressed": 2 * (n - 1) * _c(send, rx)
        + n * _c(enc, x)
        + n * _c(dec, rx)
        + (n - 1) * _c(merge, x),
    }
    for name, value in want.items():
        assert cm.time(name, m, k) == pytest.approx(value, rel=1e-9, abs=1e-12), name


def test_every_k_from_1_to_n_is_predicted() -> None:
    for n in (2, 8, 64, 1024):
        cm = CostModel(_profile(), n)
        table = cm.table(1 << 26)
        assert set(table) == {"allreduce", "allgather", "ps", "ring"}
        assert all(len(v) == n and np.all(np.isfinite(v)) for v in table.values())
    assert len(CostModel(_profile(), 64, max_partitions=4).times("ps", 1 << 26)) == 4


def test_allgather_k1_by_hand() -> None:
    p, n, m = _profile(), 8, 1 << 20
    pay = 0.25 * m + 16
    want = (
        _c((4e-7, 0.01, 0.01), m)
        + _c((2e-7, 0.005, 0.005), m)
        + (n - 1) * (_c((2e-7, 0.005, 0.005), m) + _c((1e-7, 0.002, 0.002), m))
        + 2 * _c((1e-7, 0.002, 0.002), m)  # the average and the NaN/Inf check
        + float(p.network["all_gather"].time(pay, n))
    )
    assert CostModel(p, n).time("allgather", m, 1) == pytest.approx(want)


@pytest.mark.parametrize(
    ("name", "calls"), [("allreduce", 1), ("allgather", 1), ("ps", 2), ("ring", 14)]
)
def test_a_calibrated_profile_scales_compute_and_charges_every_collective_call(
    name: str, calls: int
) -> None:
    """compute_scale multiplies the compute terms; call_ms is paid per collective CaSync issues
    (PS: an all_to_all and an all_gather; the ring at N = 8: 2(N-1) hops), per partition."""
    p, n, m = _profile(), 8, 1 << 20
    q = replace(p, compute_scale=3.0, call_ms=0.5)
    c, w = (float(v[0]) for v in CostModel(p, n)._parts(CostModel(p, n).formula(name),
                                                      CostModel(p, n)._dims(m, [1]), True))  # fmt: skip
    assert CostModel(q, n).time(name, m, 1) == pytest.approx(3 * c + w + 0.5 * calls)
    t2 = CostModel(q, n).time(name, m, 2)
    c2, w2 = (float(v[0]) for v in CostModel(q, n)._parts(CostModel(q, n).formula(name),
                                                        CostModel(q, n)._dims(m, [2]), True))  # fmt: skip
    assert t2 == pytest.approx(c2 + w2 + max(c2, w2))  # overlap 1, 2 partitions
    # a bucket's rounds pay it once per collective of the round
    rounds = CostModel(q, n).bucket_rounds([Member(name, m, 1)])
    plain = CostModel(p, n).bucket_rounds([Member(name, m, 1)])
    assert [r[1] for r in rounds] == pytest.approx([r[1] + 0.5 * calls for r in plain])
    assert [r[0] for r in rounds] == pytest.approx([3 * r[0] for r in plain])


def test_the_original_formulas_ignore_casyncs_call_cost() -> None:
    p = _profile()
    q = replace(p, call_ms=5.0)
    for f in ORIGINAL_FORMULAS:
        assert CostModel(q, 8, ORIGINAL_FORMULAS).time(f.name, 1 << 20) == pytest.approx(
            CostModel(p, 8, ORIGINAL_FORMULAS).time(f.name, 1 << 20)
        )


def test_ring_k1_by_hand() -> None:
    """CaSync's ring: N-1 re-encoding hops plus the aggregate (N encodes of a shard), N-1
    partial sums and N aggregates decoded (2N-1), N-1 adds and the average, the NaN/Inf check,
    and 2(N-1) dependent point-to-point hops of one shard's payload."""
    p, n, m = _profile(), 8, 1 << 20
    shard = m / n
    pay = 0.25 * shard + 16
    want = (
        n * _c((4e-7, 0.01, 0.01), shard)
        + (2 * n - 1) * _c((2e-7, 0.005, 0.005), shard)
        + 2 * n * _c((1e-7, 0.002, 0.002), shard)
        + 2 * (n - 1) * float(p.network["send"].time(pay, n))
    )
    assert CostModel(p, n).time("ring", m, 1) == pytest.approx(want)
    assert np.isinf(CostModel(p, n).time("ring", n - 1, 1))  # a shard per worker at least


def test_shards_cost_at_least_their_partition_in_one_run() -> None:
    """PS and the ring encode, check and decode shards of one partition: priced as at least one
    run over the whole partition, so a profile whose small sizes ran in cache (cheaper per
    element) does not make splitting look cheaper than it is."""
    from hipress.secopa.model.costfn import PiecewiseLinear

    p = _profile()
    # 1 ns per element up to 1M (in cache), 3 ns from 4M on (memory): a cache cliff
    cliff = PiecewiseLinear((1.0, 1e6, 4e6, 1e8), (0.0, 1.0, 12.0, 300.0), 3e-6)
    q = replace(p, compute={**p.compute, "encode": cliff})
    n, m = 4, 1 << 24
    cm = CostModel(q, n)
    f = cm.formula("ps")
    d = cm._dims(m, [4])  # partitions of 4M in shards of 1M
    enc = next(t for t in f.compute if t.op == "encode" and t.pieces)
    four = float(cm.compute_term(enc, d)[0])
    assert four == pytest.approx(float(q.compute_ms("encode", 4 * d.shard)[0]))
    assert four > 4 * float(q.compute_ms("encode", d.shard)[0])  # the hot figure, 4 x 1 ms
    # where the small sizes are not cheaper per element, the pieces cost what they did
    d1 = CostModel(p, n)._dims(m, [4])
    assert float(CostModel(p, n).compute_term(enc, d1)[0]) == pytest.approx(
        n * _c((4e-7, 0.01, 0.01), m / 4 / n)
    )


@given(
    m=st.integers(1 << 12, 1 << 24),
    k=st.integers(1, 8),
    ov=st.floats(0.0, 1.0),
    name=st.sampled_from(["allgather", "ps", "ring", "allreduce"]),
)
def test_pipelining_formula(m: int, k: int, ov: float, name: str) -> None:
    cm = CostModel(_profile(ov), 8)
    d = cm._dims(m, [k])
    c, w = (float(v[0]) for v in cm._parts(cm.formula(name), d, latency=True))
    t = cm.time(name, m, k)
    if not np.isfinite(t):
        return
    assert t == pytest.approx(c + w + (k - 1) * (max(c, w) + (1 - ov) * min(c, w)))
    # no overlap: K times a partition; full overlap: the bottleneck K times plus fill/drain
    if ov == 0.0:
        assert t == pytest.approx(k * (c + w))
    assert cm.pipeline_ms([(c, w)] * k) == pytest.approx(t)


def test_ps_needs_a_partition_of_at_least_n_elements() -> None:
    cm = CostModel(_profile(), 16)
    t = cm.times("ps", 40)  # 40 elements: K = 1, 2 feasible (40, 20 >= 16); K >= 3 not
    assert np.isfinite(t[:2]).all() and np.isinf(t[2:]).all()
    assert np.isinf(cm.times("ps", 10)).all()
    assert np.isfinite(cm.times("allgather", 10)[:10]).all()
    assert cm.best(10, True).name == "allgather"


@settings(deadline=None)
@given(
    m=st.integers(1, 1 << 24),
    k=st.integers(1, 8),
    name=st.sampled_from(["allgather", "ps", "allreduce"]),
    ov=st.floats(0.0, 1.0),
)
def test_a_bucket_of_one_tensor_costs_the_tensor_alone(
    m: int, k: int, name: str, ov: float
) -> None:
    cm = CostModel(_profile(ov), 8)
    t = cm.time(name, m, k)
    if np.isfinite(t):
        assert cm.bucket_ms([Member(name, m, k)]) == pytest.approx(t)


@settings(deadline=None)
@given(
    members=st.lists(
        st.tuples(
            st.sampled_from(["allgather", "ps", "allreduce"]),
            st.integers(1 << 6, 1 << 22),
            st.integers(1, 4),
        ),
        min_size=1,
        max_size=8,
    ),
    ov=st.floats(0.0, 1.0),
)
def test_batching_never_predicts_more_than_running_apart(
    members: list[tuple[str, int, int]], ov: float
) -> None:
    cm = CostModel(_profile(ov), 8)
    ms = [Member(f, m, 1 if f == "allreduce" else k) for f, m, k in members]
    ms = [x for x in ms if np.isfinite(cm.time(x.formula, x.numel, x.k))]
    together = cm.bucket_ms(ms)
    apart = sum(cm.bucket_ms([x]) for x in ms)
    assert together <= apart * (1 + 1e-9) + 1e-12


def test_marginal_cost_of_an_allreduce_member_is_its_bandwidth_share() -> None:
    n, m = 16, 1 << 20
    cm = CostModel(_profile(), n)
    op = cm.profile.network["allreduce"]
    assert isinstance(op, AlphaBeta)
    assert cm.marginal_ms("allreduce", m) == pytest.approx(
        2 * (n - 1) / n * 4 * m * op.beta_ms_per_byte
    )
    wire = cm.wire_ms("allreduce", m, [1], bound="min")[0]
    assert wire == pytest.approx(cm.marginal_ms("allreduce", m))


def test_lower_bandwidth_never_makes_a_strategy_faster() -> None:
    for n in (4, 64):
        fast, slow = CostModel(_profile(bw=1.25e10), n), CostModel(_profile(bw=1.25e8), n)
        for name in ("allreduce", "allgather", "ps"):
            a, b = fast.table(1 << 22)[name], slow.table(1 << 22)[name]
            ok = np.isfinite(a)
            assert np.all(b[ok] >= a[ok])


def test_world_size_one_costs_no_communication() -> None:
    cm = CostModel(_profile(), 1)
    assert cm.time("allreduce", 1 << 20) == 0.0
    assert cm.time("allgather", 1 << 20) > 0.0  # compression still costs its compute


def test_a_mixed_bucket_pays_the_latency_of_every_round() -> None:
    n = 8
    cm = CostModel(_profile(overlap=0.0), n)
    members = [Member("allreduce", 10), Member("allreduce", 20), Member("allgather", 1 << 20, 2)]
    rounds = cm.bucket_rounds(members)
    assert len(rounds) == 3  # one allreduce of both small tensors, two allgather rounds
    ar = cm.profile.network["allreduce"]
    assert isinstance(ar, AlphaBeta)
    assert rounds[0] == (0.0, pytest.approx(float(ar.time(4 * 30, n))))
    assert rounds[0][1] > ar.alpha_ms > 0  # latency included
    # overlap 0: the bucket is the plain sum of its rounds
    assert cm.bucket_ms(members) == pytest.approx(sum(c + w for c, w in rounds))
    without = cm.bucket_ms(members[2:])
    assert cm.bucket_ms(members) - without == pytest.approx(float(ar.time(4 * 30, n)))
