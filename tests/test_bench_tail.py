"""The network floor of ``hipress bench e2e`` (hipress.bench.tail): the bytes each rank sends
per tensor under a plan, the least exposed communication for given ready times, and the
gradients' ready times measured in backward."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hipress.bench.tail import ReadyClock, allreduce_bytes, bytes_sent, exposed_floor_ms
from hipress.compll import load


def test_bytes_sent_per_strategy() -> None:
    onebit = load("onebit", backend="reference")
    n = 1 << 20
    entries = [
        ["a", n, True, "allgather", 2],
        ["b", n, True, "ps", 1],
        ["c", 1000, False, "allreduce", 1],
    ]
    sent = bytes_sent(entries, onebit.payload_nbytes, 4)
    # all-gather: each of 2 partitions' payload to the 3 others
    assert sent["a"] == 3 * 2 * onebit.payload_nbytes(n // 2)
    # PS: 3 of the 4 shard payloads out in the scatter-reduce, its own to 3 in the all-gather
    assert sent["b"] == pytest.approx(2 * 3 * onebit.payload_nbytes(n // 4))
    assert sent["c"] == allreduce_bytes(4000, 4) == 6000


def test_exposed_floor() -> None:
    rate = 8.0  # Mbit/s: 1000 bytes per ms
    # 5000 bytes ready at the end: 5 ms exposed whatever else runs
    assert exposed_floor_ms({"x": 0.0}, {"x": 5000.0}, rate) == pytest.approx(5.0)
    # ready 10 ms before the end, 5 ms of bytes: hidden entirely
    assert exposed_floor_ms({"x": 10.0}, {"x": 5000.0}, rate) == 0.0
    # 3 ms at the end and 20 ms ready 10 ms earlier: (20 + 3) - 10 = 13 ms at the least
    got = exposed_floor_ms({"late": 0.0, "early": 10.0}, {"late": 3000.0, "early": 20000.0}, rate)
    assert got == pytest.approx(13.0)
    # a tensor without a measured ready time counts as ready at the end
    assert exposed_floor_ms({}, {"x": 2000.0}, rate) == pytest.approx(2.0)


def test_ready_clock_orders_backward() -> None:
    model = nn.Sequential(nn.Embedding(50, 16), nn.Flatten(), nn.Linear(64, 256), nn.ReLU(),
                          nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 3))  # fmt: skip
    clock = ReadyClock(model)
    x = torch.randint(0, 50, (32, 4))
    model(x).sum().backward()  # not recorded
    assert clock.leads() == {}
    clock.on = True
    for _ in range(3):
        model(x).sum().backward()
        clock.step_done()
    leads = clock.leads()
    assert set(leads) == {n for n, _ in model.named_parameters()}
    # backward runs from the output: the last layer's gradient is ready first, the embedding's last
    assert leads["6.weight"] > leads["2.weight"] > leads["0.weight"] >= 0


def test_the_e2e_report_says_when_the_floor_puts_the_target_out_of_reach() -> None:
    from hipress.bench.report import TARGET_EFFICIENCY, check_targets, e2e_markdown

    def cell(bound: float) -> dict:
        rows = [
            {"config": "compute-only", "samples_per_s": 100.0, "step_ms": 80.0},
            {"config": "ddp-fp32", "samples_per_s": 10.0, "step_ms": 800.0},
            {"config": "hipress-onebit", "samples_per_s": 70.0, "step_ms": 114.0,
             "scaling_efficiency": 0.7, "network_floor_ms": 80.0 / bound - 80.0,
             "efficiency_bound": bound},
        ]  # fmt: skip
        return {"model": "lstm-lm", "kind": "communication-heavy", "parameters": 1e6,
                "gradient_bytes": 4e6, "batch_per_worker": 8, "unit": "sequences", "data": "d",
                "network": {"label": "2 x 1000 Mbit/s", "shaped": True, "rate_mbit": 1000},
                "rows": rows}  # fmt: skip

    meta = {"workers": 2, "steps": 1, "warmup": 3, "threads_per_worker": 1, "torch": "t",
            "date": "d"}  # fmt: skip
    low, high = cell(0.75), cell(0.95)
    assert TARGET_EFFICIENCY > 0.75
    assert check_targets(low)["efficiency_bound"] == 0.75
    md = e2e_markdown({"meta": meta, "cells": [low]})
    assert "out of reach on this link: its bytes allow at most 0.75" in md
    row = next(x for x in md.splitlines() if x.startswith("| hipress-onebit |"))
    assert row.rstrip().endswith("| 26.7 | 0.75 |")  # floor ms, eff bound
    assert "out of reach" not in e2e_markdown({"meta": meta, "cells": [high]})
