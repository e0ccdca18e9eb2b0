"""Real multi-process runs (gloo, 2 processes): profiling in a group, one plan on every rank."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

from hipress.cli import main
from hipress.core.plan import PlanError
from hipress.secopa.measure.comm import TorchComm
from hipress.secopa.measure.localgroup import LocalGroupError, run_local
from hipress.secopa.measure.netprofiler import measure_network, measure_overlap, network_meta
from hipress.secopa.measure.runtime import auto_plan, plan_for_model
from hipress.secopa.measure.timed_codec import timed_cast
from hipress.secopa.model.profile import MeasuredComm, Profile
from hipress.secopa.model.specs import resolve_model


def _profile_and_plan(rank: int, world: int) -> dict[str, Any]:
    named = resolve_model("mlp").named_numels()
    net = measure_network(sizes=(1 << 10, 1 << 16, 1 << 20), reps=(5, 3, 2))
    plan = auto_plan(timed_cast("fp16"), named, world, compute_budget_s=0.3)
    # the same measurement over an explicit transport (what hipress.horovod passes its own)
    comm = TorchComm()
    via = measure_network(sizes=(1 << 10, 1 << 12), reps=(2, 2), comm=comm)
    fixed = measure_network(sizes=(1 << 10, 1 << 12), reps=(2, 2), comm=comm, extend=False)
    assert all(len(x) == 2 for x, _ in fixed.samples.values())
    # a model with a large tensor: the allreduce goes on, by 4x, up to its size
    big = measure_network(sizes=(1 << 10, 1 << 12), reps=(2, 2), comm=comm, largest=300_000)
    assert big.samples["allreduce"][0] == (1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 300000.0)
    assert big.samples["all_gather"][0] == (1024.0, 4096.0, 16384.0)
    overlap = measure_overlap(timed_cast("fp16"), comm=comm, n=1 << 12)
    matched = measure_overlap(timed_cast("fp16"), comm=comm, n=1 << 12, network=via.ops)
    assert 0.0 <= matched <= 1.0
    return {
        "via_comm": (via.samples, network_meta(via)["network_source"]["backend"], overlap),
        "samples": net.samples,
        "alpha_beta": {
            k: (m.alpha_ms, m.beta_ms_per_byte)
            for k, v in net.ops.items()
            for m in [v.model if isinstance(v, MeasuredComm) else v]
        },
        "measured": sorted(k for k, v in net.ops.items() if isinstance(v, MeasuredComm)),
        "plan": plan.to_json(),
        "digest": plan.digest(),
        "group_world": dist.get_world_size(),
    }


def test_profile_and_plan_in_a_real_group_gives_every_rank_the_same_plan() -> None:
    r0, r1 = run_local(_profile_and_plan, 2, timeout_s=240)
    # the network is measured together and MAX-reduced: identical on both ranks
    assert r0["samples"] == r1["samples"]
    assert r0["alpha_beta"] == r1["alpha_beta"]
    for alpha, beta in r0["alpha_beta"].values():
        assert alpha >= 0 and beta > 0
    # the four collectives and the ring hop keep their samples for this world size
    assert r0["measured"] == ["all_gather", "all_to_all", "allreduce", "broadcast", "send"]
    # compute was measured on each rank separately, yet the plan is rank 0's on both
    assert r0["digest"] == r1["digest"] and r0["plan"] == r1["plan"]
    assert r0["group_world"] == 2
    assert r0["via_comm"] == r1["via_comm"] and r0["via_comm"][1] == "gloo"
    assert set(r0["via_comm"][0]) == {"allreduce", "all_gather", "all_to_all", "broadcast", "send"}
    # fast (loopback): the largest size is measured 4x larger too, on every rank alike
    assert r0["via_comm"][0]["allreduce"][0] == (1024.0, 4096.0, 16384.0)
    assert 0.0 <= r0["via_comm"][2] <= 1.0


def _auto_plan_timed(rank: int, world: int) -> tuple[float, str]:
    from hipress.casync.profiling import auto_plan
    from hipress.secopa.measure.timed_codec import load_timed_codec

    named = resolve_model("mlp").named_numels()
    alg = load_timed_codec("terngrad", {"bitwidth": 2}).alg  # a real CompLL algorithm, defaults
    t = time.perf_counter()
    plan = auto_plan(alg, named)
    return time.perf_counter() - t, plan.digest()


def test_auto_plan_with_defaults_takes_a_few_seconds() -> None:
    """What ``plan="auto"`` runs at start-up: about 2 s here (a 2-core machine under load)."""
    (t0, d0), (t1, d1) = run_local(_auto_plan_timed, 2, timeout_s=120)
    assert d0 == d1
    assert max(t0, t1) < 10.0, (t0, t1)


def _calibrated(rank: int, world: int) -> dict[str, Any]:
    from hipress.casync.profiling import calibrate
    from hipress.secopa.measure.runtime import auto_profile
    from hipress.secopa.measure.timed_codec import load_timed_codec

    alg = load_timed_codec("onebit", {}).alg
    plain = auto_profile(alg, compute_budget_s=0.3, max_numel=1 << 18, calibrate_step=False)
    cal = calibrate(alg, plain, numel=1 << 15, warmup=1, steps=3, large=1 << 18)
    return {
        "plain": (plain.compute_scale, plain.call_ms, "calibration" in plain.meta),
        "cal": (cal.compute_scale, cal.call_ms),
        "by_size": cal.compute_scale_by_size,
        "meta": cal.meta["calibration"],
        "encode": [
            (float(plain.compute_ms("encode", n)), float(cal.compute_ms("encode", n)))
            for n in (1e4, 1 << 18)
        ],
    }


def test_calibration_runs_casync_and_gives_every_rank_the_same_figures() -> None:
    """Real CaSync steps in a 2-process gloo group: a compute scale and a per-call cost, the
    same on both ranks, within their ranges, and applied to the profile's compute."""
    r0, r1 = run_local(_calibrated, 2, timeout_s=240)
    assert r0["plain"] == (1.0, 0.0, False) == r1["plain"]
    assert r0["cal"] == r1["cal"]
    scale, call = r0["cal"]
    assert 0.5 <= scale <= 10.0 and 0.0 <= call <= 50.0
    assert r0["meta"]["compute_scale"] == pytest.approx(scale, abs=1e-4)
    assert len(r0["meta"]["compute_ratio_per_rank"]) == 2
    assert r0["meta"]["probe_compute_ms"]["measured"] > 0  # CaSync really encoded and decoded
    assert r0["meta"]["tiny_step_ms"]["calls"] >= 1
    # a second probe at the large size: each op is scaled by the scale at its size
    assert r0["by_size"] == r1["by_size"] and [x for x, _ in r0["by_size"]] == [1 << 15, 1 << 18]
    assert r0["by_size"][0][1] == scale and 0.5 <= r0["by_size"][1][1] <= 10.0
    assert [p["numel"] for p in r0["meta"]["probes"]] == [1 << 15, 1 << 18]
    for (plain, cal), s in zip(r0["encode"], (scale, r0["by_size"][1][1]), strict=True):
        assert cal == pytest.approx(s * plain)


def _ready_profile_and_plan(rank: int, world: int) -> dict[str, Any]:
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from hipress.secopa.measure.readiness import measure_readiness
    from hipress.secopa.measure.runtime import auto_profile

    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(4096, 256), nn.Flatten(), nn.Linear(8 * 256, 512),
                          nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))  # fmt: skip
    ddp = DDP(model)
    gen = torch.Generator().manual_seed(rank)  # each rank its own batches
    x = torch.randint(0, 4096, (64, 8), generator=gen)

    def step() -> None:
        ddp.zero_grad()
        ddp(x).square().mean().backward()

    ready = measure_readiness(ddp, step, steps=3, warmup=1)
    prof = auto_profile(timed_cast("fp16"), compute_budget_s=0.3, max_numel=1 << 20,
                        readiness=ready)  # fmt: skip
    plan = auto_plan(timed_cast("fp16"), model, world, compute_budget_s=0.3, readiness=ready)
    return {
        "leads": ready.leads_ms,
        "profile_leads": None if prof.readiness is None else dict(prof.readiness.leads_ms),
        "grad": model[0].weight.grad.sum().item(),  # local: no exchange while measuring
        "digest": plan.digest(),
        "objective": plan.meta["planner"]["objective"],
        "exposure": plan.meta.get("exposure"),
        "totals": dict(plan.totals),
    }


def test_a_real_group_records_ready_times_and_plans_by_the_exposed_step() -> None:
    r0, r1 = run_local(_ready_profile_and_plan, 2, timeout_s=240)
    names = {"0.weight", "2.weight", "2.bias", "4.weight", "4.bias", "6.weight", "6.bias"}
    for r in (r0, r1):
        # every parameter measured, by its module's name (as plans name them), not DDP's
        assert set(r["leads"]) == names and r["profile_leads"] == r["leads"]
        # backward from the output: the last layer first, the embedding last
        assert r["leads"]["6.weight"] > r["leads"]["2.weight"] > r["leads"]["0.weight"] >= 0
    # measured under no_sync: each rank kept its own gradient
    assert r0["grad"] != r1["grad"]
    # rank 0 planned with its ready times, every rank holds that plan
    assert r0["digest"] == r1["digest"] and r0["exposure"] == r1["exposure"]
    assert r0["objective"] == "exposed" and r0["exposure"]["objective"] == "exposed step"
    assert r0["totals"]["exposed"] == r0["exposure"]["exposed_ms"] >= 0


def _planning_fails_on_rank0(rank: int, world: int) -> str:
    try:
        plan_for_model([("w", 10)], None)  # no profile anywhere: rank 0 cannot plan
    except PlanError as exc:
        return str(exc)
    return "no error"


def test_a_planning_error_on_rank0_reaches_every_rank() -> None:
    msgs = run_local(_planning_fails_on_rank0, 2, timeout_s=120)
    assert all(m.startswith("planning failed on rank 0: rank 0 has no profile") for m in msgs)


def _bad_worker(rank: int, world: int) -> None:
    raise ValueError(f"boom on rank {rank}")


def test_local_group_reports_a_failing_rank() -> None:
    with pytest.raises(LocalGroupError, match="boom on rank"):
        run_local(_bad_worker, 2, timeout_s=120)


def test_cli_profile_measures_a_local_group(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out_file = tmp_path / "p.json"
    argv = ["profile", "--algorithm", "fp16", "--nproc", "2", "--budget", "0.2",
            "--threads", "1", "--out", str(out_file)]  # fmt: skip
    assert main(argv) == 0
    prof = Profile.load(out_file)
    src = prof.meta["network_source"]
    assert src["kind"] == "measured" and src["world_size"] == 2
    assert set(src["samples"]) == {"allreduce", "all_gather", "all_to_all", "broadcast", "send"}
    # a measured 2-process profile still plans for 64 workers (alpha-beta extrapolation)
    argv = ["plan", "--model", "resnet50", "--world-size", "64", "--profile", str(out_file)]
    assert main(argv) == 0
    assert "measured (gloo, 2 processes), extrapolated" in capsys.readouterr().out


def tiny_net() -> Any:
    """A small model for the benchmark smoke run (``test_secopa_dist:tiny_net``)."""
    from torch import nn

    return nn.Sequential(nn.Linear(256, 512), nn.Linear(512, 16))


def test_bench_plan_runs_casync_with_all_three_plans(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out_file = tmp_path / "bench.json"
    argv = ["bench", "plan", "--model", "test_secopa_dist:tiny_net", "--algorithm", "onebit",
            "--steps", "1", "--warmup", "1", "--budget", "0.2", "--json-out", str(out_file)]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "plan slower than both baselines:" in text
    result = json.loads(out_file.read_text())
    rows = result["rows"]
    assert set(rows) == {"planned", "all_uncompressed", "all_compressed"}
    if importlib.util.find_spec("matplotlib") is not None:  # predicted vs measured, drawn
        assert out_file.with_suffix(".png").stat().st_size > 10_000
    assert rows["all_compressed"]["compressed"] == 4 and rows["all_uncompressed"]["compressed"] == 0
    for r in rows.values():
        assert r["measured_ms"] > 0 and r["predicted_ms"] > 0
        assert r["casync_stats"]["collectives"] >= 1
    # a plan that is one of the baselines (same digest) is never "slower than both": what the
    # two measured apart is noise between identical plans
    same = [k for k in ("all_uncompressed", "all_compressed")
            if rows[k]["digest"] == rows["planned"]["digest"]]  # fmt: skip
    assert result["plan_same_as"] == same
    if same:
        assert result["plan_not_slower_than_both"]
        assert f"(it is the {same[0]} plan: same digest)" in text
    else:
        slower = rows["planned"]["measured_ms"] > max(
            rows[k]["measured_ms"] for k in ("all_uncompressed", "all_compressed")
        )
        assert result["plan_not_slower_than_both"] == (not slower)
