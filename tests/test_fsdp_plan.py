"""Which FSDP units hipress compresses (:mod:`hipress.fsdp.planning`): ``plan="default"``,
SeCoPa's ``plan="auto"`` and explicit plans, in real 2-process gloo runs of ``fully_shard``
models; and the reduce-scatter formulas SeCoPa prices the units with."""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

import pytest
import torch
import torch.distributed as dist
from dist_utils import run_workers
from torch import nn
from torch.distributed.fsdp import fully_shard

import hipress.fsdp
from hipress.fsdp import FsdpError
from hipress.fsdp.planning import price_unit
from hipress.secopa.measure.netprofiler import measure_collective
from hipress.secopa.model.costmodel import CostModel
from hipress.secopa.model.formulas import reduce_scatter_formulas
from hipress.secopa.model.network import AlphaBeta
from hipress.secopa.model.profile import Profile, ProfileError, affine_profile

PRELOAD = ("torch", "torch.distributed", "torch.distributed.fsdp", "hipress.fsdp")
BIG, TINY = 512, 4  # a Linear(512, 512) unit (262656 elements) and a Linear(4, 4) one (20)


def onebit_profile(bandwidth_bytes_per_s: float, latency_s: float) -> Profile:
    """onebit's costs on a CPU core (1 ns per element to encode or decode, 0.5 to add, 10 us
    per call) over a link of this bandwidth and latency."""
    return affine_profile(
        "onebit",
        encode=(1e-6, 0.01, 0.0),
        decode=(1e-6, 0.01, 0.0),
        merge=(5e-7, 0.01, 0.0),
        bytes_per_element=1 / 8,
        header=8.0,
        bandwidth_bytes_per_s=bandwidth_bytes_per_s,
        latency_s=latency_s,
    )


SLOW = (12.5e6, 50e-6)  # 100 Mbit/s
FAST = (5e10, 5e-6)  # 400 Gbit/s


# ---------------------------------------------------------------- the formulas, by hand


def test_reduce_scatter_formulas_mean_what_they_say() -> None:
    # linear costs (no floors) on a link: every term can be written out
    e, dec, mer, bpe, hdr, tr = 2e-6, 3e-6, 1e-6, 0.25, 16.0, 8.0
    prof = affine_profile("x", encode=(e, 0, 0), decode=(dec, 0, 0), merge=(mer, 0, 0),
                          bytes_per_element=bpe, header=hdr, bandwidth_bytes_per_s=1e8,
                          latency_s=1e-4)  # fmt: skip
    alpha, beta = 0.1, 1e3 / 1e8  # ms, ms per byte
    for n, m, gb in [(2, 1 << 20, 4), (4, 1 << 20, 2), (8, 3 << 16, 4)]:
        model = CostModel(prof, n, reduce_scatter_formulas(gb, tr), 1)
        shard = m / n
        # a ring reduce-scatter: N-1 steps, (N-1)/N of the input on the wire, N-1 adds of a shard
        plain = alpha * (n - 1) + beta * (n - 1) / n * gb * m + (n - 1) * mer * shard
        assert model.time("reduce_scatter", m) == pytest.approx(plain, rel=1e-12)
        # N checks and encodes of a shard; decode_sum of N payloads (no decode_sum2 in this
        # profile: decode, N-1 decode_acc = decode + merge, and a merge to average); one
        # all_to_all of N payloads, each with its header and trailer
        compute = n * mer * shard + n * e * shard + dec * shard
        compute += (n - 1) * (dec + mer) * shard + mer * shard
        sent = n * (bpe * shard + hdr + tr)
        comp = compute + alpha * (n - 1) + beta * (n - 1) / n * sent
        assert model.time("compressed_reduce_scatter", m) == pytest.approx(comp, rel=1e-12)
        parts = model.parts("compressed_reduce_scatter", m)
        assert parts == pytest.approx((compute, comp - compute), rel=1e-12)
    # one element per rank at least, else it cannot compress
    assert math.isinf(CostModel(prof, 4, reduce_scatter_formulas(), 1).time(
        "compressed_reduce_scatter", 3))  # fmt: skip


def test_a_measured_reduce_scatter_replaces_the_all_to_all() -> None:
    base = onebit_profile(*SLOW)
    own = AlphaBeta(1.0, 1e-9, ("pairwise_alltoall",))
    prof = dataclasses.replace(base, network={**base.network, "reduce_scatter": own})
    m = 1 << 16
    a = CostModel(base, 2, reduce_scatter_formulas(), 1).time("reduce_scatter", m)
    b = CostModel(prof, 2, reduce_scatter_formulas(), 1).time("reduce_scatter", m)
    assert b == pytest.approx(1.0 + 1e-9 * 2 * m + 5e-7 * m / 2 + 0.01)
    assert a > 10 * b  # the all_to_all at 100 Mbit/s


def test_price_unit_honours_world_size_dtype_and_margin() -> None:
    slow = onebit_profile(*SLOW)
    p2, c2, on2 = price_unit(slow, 1 << 20, 2, torch.float32)
    p8, _, _ = price_unit(slow, 1 << 20, 8, torch.float32)
    assert on2 and c2 < p2 and p8 > p2  # (N-1)/N of the input on the wire
    pb, _, _ = price_unit(slow, 1 << 20, 2, torch.bfloat16)
    assert pb < 0.55 * p2  # half the bytes
    # the margin: compress only where the compressed time is that much lower
    ratio = c2 / p2
    assert price_unit(slow, 1 << 20, 2, torch.float32, margin=1 - ratio * 1.01)[2]
    assert not price_unit(slow, 1 << 20, 2, torch.float32, margin=1 - ratio * 0.99)[2]
    assert price_unit(slow, 1 << 20, 1, torch.float32)[2] is False


# ---------------------------------------------------------------- errors before any group


def test_bad_plan_values_raise_naming_the_choices() -> None:
    for bad in ("Auto", "size", 3, ["0"]):
        with pytest.raises(FsdpError, match=r"'default'.*'auto'.*mapping.*callable"):
            hipress.fsdp.register(nn.Linear(4, 4), "onebit", plan=bad)  # type: ignore[arg-type]
    with pytest.raises(FsdpError, match="profile= is what plan='auto' prices with"):
        hipress.fsdp.register(nn.Linear(4, 4), "onebit", profile=onebit_profile(*SLOW))
    bad_profile: Any = 3
    with pytest.raises(FsdpError, match="profile must be"):
        hipress.fsdp.register(nn.Linear(4, 4), "onebit", plan="auto", profile=bad_profile)


# ---------------------------------------------------------------- 2-process gloo runs


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(BIG, BIG), nn.ReLU(), nn.Linear(BIG, TINY), nn.Linear(TINY, TINY))
    for layer in (m[0], m[3]):
        fully_shard(layer)
    fully_shard(m)  # "<root>" holds Linear(512, 4)
    return m


def _step(model: nn.Module) -> None:
    x = torch.randn(4, BIG, generator=torch.Generator().manual_seed(dist.get_rank()))
    model(x).square().sum().backward()


def _summary(comp: Any) -> dict[str, Any]:
    calls = comp.stats()["units"]
    return {
        "plan": {
            k: (u.compress, u.source, u.plain_ms, u.compressed_ms, u.numel)
            for k, u in comp.plan.units.items()
        },
        "compressed_calls": {k: calls[k]["compressed_calls"] for k in calls},
        "table": comp.plan.table(),
        "repr": repr(comp),
        "meta": dict(comp.plan.meta),
    }


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def plans(rank: int, world_size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    logger = logging.getLogger("hipress.fsdp.register")
    logger.setLevel(logging.INFO)
    lines = _Lines()
    logger.addHandler(lines)
    for name, kwargs in [
        ("slow", {"plan": "auto", "profile": onebit_profile(*SLOW)}),
        ("fast", {"plan": "auto", "profile": onebit_profile(*FAST)}),
        # "<root>" (2052 elements) is under the size rule's 65536; the mapping turns it on
        # and "0" off, and "3" is left to the rule
        ("mapping", {"plan": {"<root>": True, "0": False}}),
        ("callable", {"plan": lambda unit: unit == "3"}),
        ("default", {}),
    ]:
        model = _model()
        comp = hipress.fsdp.register(model, "onebit", **kwargs)
        _step(model)
        out[name] = _summary(comp)
    logger.removeHandler(lines)
    out["log"] = lines.lines
    errors = []
    topk = dataclasses.replace(onebit_profile(*SLOW), algorithm="topk")
    for bad in [
        {"plan": {"0": True, "blocks.0": True}},
        {"plan": {"0": "yes"}},
        {"plan": lambda unit: rank == 0},  # the ranks disagree
        {"plan": "auto", "profile": topk},
    ]:
        try:
            hipress.fsdp.register(_model(), "onebit", **bad)
        except FsdpError as exc:
            errors.append(str(exc))
    out["errors"] = errors
    return out


def test_auto_mapping_and_callable_decide_per_unit() -> None:
    results = run_workers(plans, 2, preload=PRELOAD)
    r0, r1 = results
    for name in ("slow", "fast", "mapping", "callable", "default"):
        assert r0[name]["plan"] == r1[name]["plan"], name
    slow, fast = r0["slow"]["plan"], r0["fast"]["plan"]
    assert set(slow) == {"0", "3", "<root>"}
    assert slow["0"][4] == BIG * BIG + BIG and slow["3"][4] == TINY * TINY + TINY
    # 100 Mbit/s: the big unit compresses (by far), the tiny one does not
    assert slow["0"][0] and slow["0"][3] < 0.2 * slow["0"][2]
    assert not slow["3"][0] and slow["3"][3] > slow["3"][2]
    # and the root's 2052 elements, which the size rule (65536) leaves plain, compress there
    assert slow["<root>"][0] and not r0["default"]["plan"]["<root>"][0]
    assert all(u[1] == "auto" for u in slow.values())
    # 400 Gbit/s: nothing does; the plain reduce-scatter is predicted faster for every unit
    assert not any(u[0] for u in fast.values())
    assert all(u[2] < u[3] for u in fast.values())
    # the decisions are what runs: compressed calls only on the compressed units
    for name in ("slow", "fast", "mapping", "callable", "default"):
        plan, calls = r0[name]["plan"], r0[name]["compressed_calls"]
        assert {k: calls[k] > 0 for k in calls} == {k: u[0] for k, u in plan.items()}, name
    mapping = r0["mapping"]["plan"]
    assert {k: (u[0], u[1]) for k, u in mapping.items()} == {
        "0": (False, "explicit"), "<root>": (True, "explicit"), "3": (False, "default"),
    }  # fmt: skip
    assert {k: u[0] for k, u in r0["callable"]["plan"].items()} == {
        "0": False, "3": True, "<root>": False,
    }  # fmt: skip
    assert {k: u[0] for k, u in r0["default"]["plan"].items()} == {
        "0": True, "3": False, "<root>": False,
    }  # fmt: skip
    # visible: repr, the table (and the log on rank 0 only)
    assert "plan=auto, 2/3 units compressed" in r0["slow"]["repr"]
    table = r0["slow"]["table"].splitlines()
    assert table[0].startswith("hipress.fsdp plan (auto, margin 10%, network link 0.1 Gbit/s")
    assert r0["slow"]["meta"]["calibration"] is None and "compute x" not in table[0]
    assert table[0].endswith("2 of 3 units compressed")
    row = next(t.split() for t in table if t.startswith("0 "))
    assert row[1] == str(BIG * BIG + BIG) and row[3] == "float32" and row[-1] == "yes"
    assert float(row[4]) == pytest.approx(slow["0"][2], abs=1e-3)
    rows = [t.split() for t in r0["mapping"]["table"].splitlines()[2:]]
    assert {r[0]: " ".join(r[6:]) for r in rows} == {
        "<root>": "yes", "0": "no", "3": "no (default)",
    }  # fmt: skip
    assert any(t == r0["slow"]["table"] for t in r0["log"])
    assert not any(t.startswith("hipress.fsdp plan") for t in r1["log"])
    for r in results:
        unknown, notbool, disagree, other = r["errors"]
        assert "['blocks.0']" in unknown and "the units are ['<root>', '0', '3']" in unknown
        assert "True or False" in notbool
        assert "disagree on plan" in disagree and "rank 1:" in disagree
        assert "the profile is for 'topk'" in other


def measured(rank: int, world_size: int) -> dict[str, Any]:
    model = _model()
    comp = hipress.fsdp.register(model, "onebit", plan="auto")
    _step(model)
    out = _summary(comp)
    rs = measure_collective("reduce_scatter", "ring_reducescatter", sizes=(1 << 12, 1 << 16),
                            reps=(3, 3))  # fmt: skip
    out["rs"] = (rs.world_size, rs.sizes, rs.times_ms, rs.model.algorithms)
    try:
        measure_collective("reduce_scatter", "ring", sizes=(1 << 12, 1 << 16), reps=(3, 3))
    except ProfileError as exc:
        out["rs_error"] = str(exc)
    return out


def test_auto_measures_the_group_and_every_rank_runs_rank0s_decisions() -> None:
    r0, r1 = run_workers(measured, 2, preload=PRELOAD, timeout=180.0)
    assert r0["plan"] == r1["plan"] and r0["table"] == r1["table"]
    assert r0["meta"]["network"] == "measured over gloo at 2 ranks"
    # calibrated on a compressed reduce-scatter of the largest unit's size
    cal = r0["meta"]["calibration"]
    assert cal["numel"] == BIG * BIG + BIG and cal["measured_ms"] > 0
    assert 0.5 <= cal["compute_scale"] <= 10.0
    assert f"compute x{cal['compute_scale']:.2f}" in r0["table"].splitlines()[0]
    # the reduce-scatter measured as the profile's collectives are: the same on every rank
    assert r0["rs"] == r1["rs"]
    world, sizes, times, algorithms = r0["rs"]
    assert world == 2 and sizes[:2] == (4096.0, 65536.0) and algorithms == ("ring_reducescatter",)
    assert all(t > 0 for t in times) and "unknown collective algorithm 'ring'" in r0["rs_error"]
    for k, (on, source, plain, comp, _) in r0["plan"].items():
        assert source == "auto" and 0 < plain < math.inf and comp > 0
        assert on == (comp <= 0.9 * plain), k
        assert (r0["compressed_calls"][k] > 0) == on
