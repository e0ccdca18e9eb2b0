"""The end-to-end benchmark's machinery (hipress.bench.e2e) on unshaped loopback: DDP's own
cost as a configuration, bucket-view gradients, and a step timeline with its breakdown per
configuration. (The figures themselves are the benchmark's business, not a test's.)"""

from __future__ import annotations

import json
from pathlib import Path

from hipress.bench.e2e import COMPUTE, NOCOMM, Config, E2EOptions, _derive, run_config
from hipress.bench.models import WORKLOADS
from hipress.bench.netsim import LoopbackNetwork
from hipress.bench.timeline import BREAKDOWN


def test_configurations_run_and_keep_their_timelines(tmp_path: Path) -> None:
    opts = E2EOptions(workers=2, rates_mbit=(None,), models=("lstm-lm",), algorithms=("onebit",),
                      plan=None, steps=2, warmup=3, repeats=1, shaped=False,
                      trace_dir=str(tmp_path))  # fmt: skip
    data = WORKLOADS["lstm-lm"].prepare()
    configs = [COMPUTE, NOCOMM, Config("hipress-onebit", "hipress", algorithm="onebit", plan=None)]
    with LoopbackNetwork(2, "test") as net:
        rows = [run_config(net, "lstm-lm", data, c, opts) for c in configs]
    assert [r.get("error") for r in rows] == [None] * 3
    _derive(rows)
    for row in rows:
        assert set(BREAKDOWN) <= set(row["breakdown"]) and row["breakdown"]["step"] > 0
        assert [Path(t).name for t in row["traces"]] == [
            f"{row['config']}-rank0.json",
            f"{row['config']}-rank1.json",
        ]
        assert row["of_ddp_ceiling"] > 0
        doc = json.loads(Path(row["traces"][0]).read_text())
        assert doc["metadata"]["config"] == row["config"]
    compute, nocomm, onebit = rows
    assert compute["breakdown"]["encode"] == 0 and nocomm["breakdown"]["encode"] == 0
    assert onebit["breakdown"]["encode"] > 0 and onebit["breakdown"]["network"] > 0
    assert onebit["compressed_tensors"] >= 2  # the default rule compressed the big tensors
    # two workers: the default rule's all-gather
    assert {e[3] for e in onebit["plan"]["entries"] if e[2]} == {"allgather"}
    assert NOCOMM.describe().startswith("DDP, no gradient exchange")
