"""The end-to-end benchmark's machinery (hipress.bench.e2e) on unshaped loopback: DDP's own
cost as a configuration, bucket-view gradients, and a step timeline with its breakdown per
configuration, and the FSDP2 rows of ``--fsdp``. (The figures themselves are the benchmark's
business, not a test's.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from hipress.bench import fsdp as fsdp_bench
from hipress.bench.e2e import (
    COMPUTE,
    NOCOMM,
    SYNC,
    Config,
    E2EOptions,
    configs_for,
    fsdp_configs_for,
    run_config,
)
from hipress.bench.e2e_rows import derive, floors, fsdp_blocks
from hipress.bench.netsim import LoopbackNetwork
from hipress.bench.report import e2e_markdown
from hipress.bench.workloads import WORKLOADS
from hipress.core.plan import gather_own
from hipress.timeline import BREAKDOWN


def test_configurations_run_and_keep_their_timelines(tmp_path: Path) -> None:
    opts = E2EOptions(workers=2, rates_mbit=(None,), models=("lstm-lm",), algorithms=("onebit",),
                      plans=(None,), steps=2, warmup=3, repeats=1, shaped=False,
                      trace_dir=str(tmp_path))  # fmt: skip
    data = WORKLOADS["lstm-lm"].prepare()
    configs = [COMPUTE, NOCOMM, SYNC,
               Config("hipress-onebit", "hipress", algorithm="onebit", plan=None)]  # fmt: skip
    with LoopbackNetwork(2, "test") as net:
        rows = [run_config(net, "lstm-lm", data, c, opts) for c in configs]
    assert [r.get("error") for r in rows] == [None] * 4
    derive(rows)
    for row in rows:
        assert set(BREAKDOWN) <= set(row["breakdown"]) and row["breakdown"]["step"] > 0
        assert [Path(t).name for t in row["traces"]] == [
            f"{row['config']}-rank0.json",
            f"{row['config']}-rank1.json",
        ]
        assert row["of_ddp_ceiling"] > 0
        doc = json.loads(Path(row["traces"][0]).read_text())
        assert doc["metadata"]["config"] == row["config"]
    compute, nocomm, sync, onebit = rows
    assert compute["breakdown"]["encode"] == 0 and nocomm["breakdown"]["encode"] == 0
    assert onebit["breakdown"]["encode"] > 0 and onebit["breakdown"]["network"] > 0
    assert onebit["compressed_tensors"] >= 2  # the default rule compressed the big tensors
    # two workers: the default rule's all-gather
    assert {e[3] for e in onebit["plan"]["entries"] if e[2]} == {"allgather"}
    assert NOCOMM.describe().startswith("DDP, no gradient exchange")
    # the LM's input embedding is the last gradient backward produces
    leads = compute["grad_ready_lead_ms"]
    assert min(leads, key=leads.__getitem__) == "embed.weight"
    assert leads["out.head.weight"] > leads["embed.weight"] >= 0
    numels = {e[0]: e[1] for e in onebit["plan"]["entries"]}
    # the embedding travels as rows (counted in step 1): the entry holds its rows, bound and
    # the rows of the last step's summed gradient (the union of the ranks' rows)
    embed = next(e for e in onebit["plan"]["entries"] if e[0] == "embed.weight")
    _, numel, compress, _, _, n_rows, bound, union = embed
    assert not compress and 0 < union <= 2 * bound < n_rows
    floors(rows, numels, 2, 1000.0)
    # its bound's indices and its rows at 125 kB per ms, less its lead, at the least: the
    # other rank's rows all-gathered (at the count the bound was set for), or the union's
    # allreduced (a ring of two sends it once), whichever CaSync sends
    width, most = numel // n_rows, (bound - 1) // 2
    rows_sent = most if gather_own(2, most, union) else union
    least = (8 * (bound + 1) + 4 * rows_sent * width) / 125e3 - leads["embed.weight"]
    assert onebit["network_floor_ms"] >= least - 1e-9
    assert 0 < onebit["efficiency_bound"] < 1
    assert "network_floor_ms" not in nocomm and "network_floor_ms" not in sync
    # the floor of the same plan with the embedding dense: its fp32 allreduce, far more
    dense = {**onebit, "plan": {"entries": [e[:5] for e in onebit["plan"]["entries"]]}}
    floors([compute, dense], numels, 2, 1000.0)
    assert dense["network_floor_ms"] > onebit["network_floor_ms"] + 100


def test_row_sparse_bytes_in_the_floor() -> None:
    from hipress.bench.tail import allreduce_bytes, bytes_sent, row_bytes_sent

    def pay(k: int) -> int:
        return k // 8

    # 1000 rows of 64: bound 21 (set for 10 rows a rank), 30 rows in the union: exact rows go
    # as each rank's own 10, all-gathered (a ring all-gather sends N-1 blocks: indices 3 x 22
    # int64, rows 3 x 10)
    exact = row_bytes_sent(64_000, 1000, 21, 30, False, pay, 4)
    assert exact == pytest.approx(3 * 8 * 22 + 3 * 4 * 10 * 64)
    # ranks sharing most rows (a union of 15): the union allreduced, a ring's 2(N-1)/N share
    shared = row_bytes_sent(64_000, 1000, 21, 15, False, pay, 4)
    assert shared == pytest.approx(3 * 8 * 22 + 1.5 * 4 * 15 * 64)
    comp = row_bytes_sent(64_000, 1000, 21, 30, True, pay, 4)
    assert comp == pytest.approx(3 * 8 * 22 + 3 * 30 * 64 // 8)
    # no union measured: the most a sparse step sends, N x (bound - 1) / 2 rows
    assert row_bytes_sent(64_000, 1000, 21, None, False, pay, 4) == pytest.approx(
        row_bytes_sent(64_000, 1000, 21, 40, False, pay, 4))  # fmt: skip
    entries = [["e", 64_000, False, "allreduce", 1, 1000, 21, 30],
               ["d", 64_000, False, "allreduce", 1]]  # fmt: skip
    sent = bytes_sent(entries, pay, 4)
    assert sent["e"] == pytest.approx(exact) and sent["d"] == allreduce_bytes(4 * 64_000, 4)
    assert sent["e"] < sent["d"] / 20
    # a lossless row (no algorithm: everything plain, the embedding as exact rows) has a floor
    compute = {"config": COMPUTE.name, "samples_per_s": 1.0, "step_ms": 100.0,
               "grad_ready_lead_ms": {"e": 0.0, "d": 50.0}}  # fmt: skip
    lossless = {"config": "hipress-none-rows", "samples_per_s": 1.0, "plan": {"entries": entries}}
    floors([compute, lossless], {"e": 64_000, "d": 64_000}, 4, 1000.0)
    assert lossless["network_floor_ms"] == pytest.approx(exact / 125e3)


def test_fsdp_rows_with_memory_traffic_and_speedups() -> None:
    opts = E2EOptions(workers=2, rates_mbit=(None,), models=("resnet",), algorithms=("onebit",),
                      steps=1, warmup=3, repeats=1, shaped=False, fsdp=True,
                      fsdp_reshard=(True, False))  # fmt: skip
    configs = fsdp_configs_for(opts)
    assert [c.name for c in configs] == ["fsdp-fp32", "fsdp-bf16-reduce", "fsdp-hipress-onebit"]
    assert fsdp_configs_for(E2EOptions()) == []  # off by default: the DDP cell is unchanged
    bf16 = fsdp_configs_for(E2EOptions(fsdp=True, algorithms=("onebit",), fsdp_bf16_params=True))
    assert [c.name for c in bf16][3:] == ["fsdp-bf16", "fsdp-hipress-onebit-bf16"]
    assert bf16[4].policy().param_dtype is torch.bfloat16 and bf16[4].policy().reduce_dtype is None
    data = WORKLOADS["resnet"].prepare()
    runs: dict[tuple[bool, str], list[dict[str, Any]]] = {}
    # the cell's compute-only row, as run_matrix has it by then
    compute = {"config": COMPUTE.name, "samples_per_s": 1000.0, "step_ms": 64.0}
    with LoopbackNetwork(2, "test") as net:
        # resharding: every configuration; without: plain FSDP2 only (enough for its traffic)
        for reshard, cfgs in ((True, configs), (False, configs[:1])):
            for c in cfgs:
                row = fsdp_bench.measure(net, "resnet", data, c, warmup=opts.warmup,
                                         steps=opts.steps, lr=opts.lr, reshard=reshard,
                                         timeout=opts.timeout, threads=1)  # fmt: skip
                runs[(reshard, c.name)] = [row]
    cell = {"model": "resnet", "kind": "compute-heavy", "parameters": 1, "gradient_bytes": 4,
            "batch_per_worker": 32, "unit": "images", "data": "synthetic",
            "network": {"label": "loopback", "shaped": False}, "rows": [compute]}  # fmt: skip
    cell["fsdp"] = fsdp_blocks(opts, runs, cell)
    on, off = cell["fsdp"]
    assert on["reshard_after_forward"] and not off["reshard_after_forward"]
    assert [r.get("error") for r in on["rows"] + off["rows"]] == [None] * 4
    plain, peer, ours = on["rows"]
    for r in on["rows"]:
        assert r["scaling_efficiency"] == r["samples_per_s"] / 1000.0 > 0
        assert set(r["speedup"]) == {"fsdp-fp32", "fsdp-bf16-reduce"}
        assert r["wire_bytes_per_step"] is None  # loopback: no counter of its own
        m = r["memory_per_rank"]
        assert m["params_shard"] > 0 and m["peak_rss"] > m["params_shard"]
    assert plain["speedup"]["fsdp-fp32"] == 1.0 and ours["memory_per_rank"]["feedback"] > 0
    assert plain["memory_per_rank"]["feedback"] == 0
    # resharding gathers every unit twice, the gradient is reduce-scattered once
    t, t_off = plain["traffic"], off["rows"][0]["traffic"]
    assert t["allgather_bytes"] == 2 * t["reduce_scatter_bytes"] == 2 * t_off["allgather_bytes"]
    assert peer["traffic"]["reduce_scatter_bytes"] == t["reduce_scatter_bytes"] / 2
    assert ours["traffic"]["allgather_bytes"] == t["allgather_bytes"]
    assert 0 < ours["traffic"]["reduce_scatter_bytes"] < peer["traffic"]["reduce_scatter_bytes"]
    assert on["bound"]["allgather_units"] == 2.0 and off["bound"] == {}  # no hipress row off
    assert 1 < on["bound"]["vs_fsdp_fp32"] < 1.5
    assert on["targets"] == {"best": None, "applies": False}  # compute-heavy, loopback
    md = e2e_markdown({"meta": {"workers": 2, "steps": 1, "warmup": 3, "threads_per_worker": 1,
                                "torch": "t", "date": "d"}, "cells": [cell]})  # fmt: skip
    assert "### FSDP2, resharding after forward" in md
    assert "### FSDP2, reshard_after_forward=False" in md
    line = next(x for x in md.splitlines() if x.startswith("| fsdp-hipress-onebit |"))
    assert line.count("|") == 14 and "at most" in md
    json.dumps(cell)  # the JSON holds it all


def test_the_command_line_takes_the_gpt_models(tmp_path: Path, monkeypatch: Any) -> None:
    import hipress.bench.e2e as e2e
    from hipress.bench import report
    from hipress.cli import main

    seen: list[E2EOptions] = []

    def fake(opts: E2EOptions, progress: Any = None) -> dict[str, Any]:
        seen.append(opts)
        return {"meta": {"workers": opts.workers, "steps": opts.steps, "warmup": opts.warmup,
                         "threads_per_worker": 1, "torch": "t", "date": "d"}, "cells": []}  # fmt: skip

    monkeypatch.setattr(e2e, "run_matrix", fake)
    monkeypatch.setattr(report, "e2e_png", lambda *a: None)  # no cells to draw
    args = ["bench", "e2e", "--models", "gpt,gpt-untied", "--workers", "2", "--loopback",
            "--out", str(tmp_path), "--no-trace"]  # fmt: skip
    assert main(args) == 0
    assert seen[0].models == ("gpt", "gpt-untied") and seen[0].workers == 2
    assert seen[0].row_sparse == ()
    # --rows: the row-sparse rows, by algorithm (none: lossless)
    assert main([*args, "--algorithms", "onebit", "--rows", "none,onebit"]) == 0
    assert seen[1].row_sparse == ("none", "onebit")
    names = [c.name for c in configs_for(seen[1])]
    assert names[-3:] == ["hipress-onebit", "hipress-none-rows", "hipress-onebit-rows"]
    # --plan with several: a hipress row per plan, the first by the algorithm's name
    assert main([*args, "--algorithms", "onebit,powersgd", "--plan", "auto,default"]) == 0
    assert seen[2].plans == ("auto", None)
    ours = [(c.name, c.plan) for c in configs_for(seen[2]) if c.name.startswith("hipress-")]
    assert ours == [("hipress-onebit", "auto"), ("hipress-onebit-default", None),
                    ("hipress-powersgd", None)]  # (a multi-round algorithm: one plan)  # fmt: skip
    with pytest.raises(ValueError, match="no two of the same name"):
        E2EOptions(plans=("a/p.json", "b/p.json"))
    # --include: each hipress row and its twin that may compress those parameters too
    assert main([*args, "--algorithms", "onebit,powersgd", "--include", "embed.weight"]) == 0
    assert seen[3].include == ("embed.weight",)
    ours = [(c.name, c.include) for c in configs_for(seen[3]) if c.name.startswith("hipress-")]
    assert ours == [("hipress-onebit", ()), ("hipress-onebit-include", ("embed.weight",)),
                    ("hipress-powersgd", ())]  # fmt: skip
    assert "include=['embed.weight']" in configs_for(seen[3])[-2].describe()


def test_an_include_that_names_no_parameter_is_an_error() -> None:
    from hipress.bench.e2e_worker import _check_include

    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 2))
    _check_include(("0.weight", "1.*"), model)  # each names a parameter
    with pytest.raises(ValueError, match=r"include: \['embed.weight'\] match no parameter"):
        _check_include(("1.bias", "embed.weight"), model)
    assert {"gpt", "gpt-untied"} <= set(WORKLOADS)
    assert WORKLOADS["gpt"].kind == WORKLOADS["gpt-untied"].kind == "communication-heavy"


def test_local_step_rows_report_utilisation_and_bytes() -> None:
    """A local-step row in a cell: hipress's DiLoCo with onebit, run beside the compute-only
    row, gets its utilisation, bytes per outer sync and time per sync."""
    from hipress.bench.e2e_local import finish_local, local_markdown, local_rows, run_local

    rows = local_rows(("diloco-onebit-h2", "diloco-none-h2"), ())
    assert [r.variant for r in rows] == ["diloco-onebit-h2", "diloco-none-h2"]
    with pytest.raises(ValueError, match="local-step variant 'diloco-nosuch-h2'"):
        E2EOptions(local_steps=("diloco-nosuch-h2",))
    opts = E2EOptions(workers=2, rates_mbit=(None,), models=("lstm-lm",), steps=3, warmup=3,
                      repeats=1, shaped=False, local_steps=("diloco-onebit-h2",))  # fmt: skip
    data = WORKLOADS["lstm-lm"].prepare()
    with LoopbackNetwork(2, "test") as net:
        cell_rows = [run_config(net, "lstm-lm", data, COMPUTE, opts)]
        cell_rows.append(run_local(net, "lstm-lm", data, rows[0], opts.steps, opts.lr, 300, 1))
    assert [r.get("error") for r in cell_rows] == [None] * 2
    derive(cell_rows)
    finish_local(cell_rows, COMPUTE.name)
    onebit = cell_rows[1]
    assert onebit["steps"] == 4 and onebit["h"] == 2  # 3 steps rounded up to whole periods
    assert onebit["utilisation"] == onebit["scaling_efficiency"] > 0
    assert onebit["outer_sync_s"] > 0 and onebit["sync_exposed_ms"] >= 0
    # the sync's parts add up to it, and the CPU work alone leaves the loop below full speed
    parts = ("outer_wait_s", "outer_encode_s", "outer_decode_s", "outer_step_s")
    assert sum(onebit[k] for k in parts) == pytest.approx(onebit["outer_sync_s"], rel=1e-6)
    assert min(onebit[k] for k in parts[1:]) > 0 and 0 < onebit["cpu_bound"] < 1
    # one bit per element and a scale per chunk, where uncompressed sends four bytes each
    numel = sum(p.numel() for p in WORKLOADS["lstm-lm"].build(data).parameters())
    assert numel / 8 <= onebit["payload_bytes_per_sync"] < 4 * numel / 20
    table = "\n".join(local_markdown({"rows": cell_rows}))
    assert "| diloco-onebit-h2 | 2 |" in table and "compute-only" not in table


def test_cpu_bound_is_the_period_over_the_period_and_the_sync_work() -> None:
    """H steps of compute against each fragment's encode, decode and step (waits excluded)."""
    from hipress.bench.diloco import cpu_bound

    row = {"h": 16, "fragments": 1, "outer_wait_s": 9.0, "outer_encode_s": 0.05,
           "outer_decode_s": 0.03, "outer_step_s": 0.12}  # fmt: skip
    assert cpu_bound(row, 0.1) == pytest.approx(1.6 / (1.6 + 0.2))
    assert cpu_bound({**row, "fragments": 4}, 0.1) == pytest.approx(1.6 / (1.6 + 0.8))
