"""The network floor and efficiency bound of ``hipress bench e2e``'s hipress-powersgd row:
each round's payload counts as an all-reduce's share from its gradient's ready time."""

from __future__ import annotations

import pytest

from hipress.bench.e2e_configs import COMPUTE
from hipress.bench.e2e_rows import floors
from hipress.bench.tail import allreduce_bytes, bytes_sent


def test_rounds_bytes_set_the_powersgd_rows_floor() -> None:
    entries = [["w", 512 * 1024, True, "rounds", 1], ["b", 512, False, "allreduce", 1]]
    rounds = {"w": [512 * 2 * 4, 1024 * 2 * 4]}  # P (rows x rank) then Q (cols x rank)
    sent = bytes_sent(entries, None, 4, rounds)
    assert sent["w"] == pytest.approx(allreduce_bytes((512 + 1024) * 2 * 4, 4))
    assert sent["b"] == allreduce_bytes(4 * 512, 4)
    with pytest.raises(ValueError, match="w: a rounds entry needs its rounds' payload bytes"):
        bytes_sent(entries, None, 4)
    compute = {"config": COMPUTE.name, "samples_per_s": 1.0, "step_ms": 100.0,
               "grad_ready_lead_ms": {"w": 0.0, "b": 0.0}}  # fmt: skip
    row = {"config": "hipress-powersgd", "samples_per_s": 1.0, "algorithm": "powersgd",
           "plan": {"entries": entries, "round_bytes": rounds}}  # fmt: skip
    floors([compute, row], {"w": 512 * 1024, "b": 512}, 4, 1000.0)
    assert row["network_floor_ms"] == pytest.approx((sent["w"] + sent["b"]) / 125e3)
    assert row["efficiency_bound"] == pytest.approx(100.0 / (100.0 + row["network_floor_ms"]))
    assert 0 < row["bucket_efficiency_bound"] <= 1
