"""``hipress selftest``: the CPU half here (kernels against the reference, the emulated CUDA
kernels, speed); the checks of :mod:`hipress.selftest_dist` (CaSync over DDP, hipress.fsdp's
compressed reduce-scatter) under real 1- and 2-process torchrun launches on gloo, compressing
for real, and failing when made to compress nothing; on a GPU (marked cuda) all of it."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from integration_launch import run

HIPRESS = [sys.executable, "-m", "hipress"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
COMPRESSED = ("onebit near DDP", "terngrad near DDP", "onebit/auto = reference",
              "terngrad/int8 = reference")  # fmt: skip
REGISTER = "onebit through fully_shard + register near FSDP2"


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", **extra}


def _run(cmd: list[str], tmp_path: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=tmp_path,
                          env=_env(), check=False)  # fmt: skip


def _torchrun(nproc: int, tmp_path: Path, timeout: float = 300,
              **env: str) -> tuple[int, str, list[dict[str, Any]]]:  # fmt: skip
    """``torchrun --nproc-per-node nproc -m hipress selftest --quick`` in ``tmp_path``, in a
    session of its own (killed whole past ``timeout``): its exit status, output and every
    rank's JSON report."""
    rc, out = run([*TORCHRUN, "--nproc-per-node", str(nproc), "-m", "hipress", "selftest",
                   "--quick"], tmp_path, "the selftest under torchrun", timeout, _env(**env))  # fmt: skip
    results = tmp_path / "hipress-results"
    reports = [json.loads((results / f"selftest-rank{r}.json").read_text()) for r in range(nproc)]
    return rc, out, reports


def _dist_checks(report: dict[str, Any]) -> dict[str, str]:
    return {k: v for k, v in report["checks"].items() if k.startswith(("training", "FSDP"))}


def _named(checks: dict[str, Any], suffix: str) -> str:
    (name,) = [k for k in checks if k.endswith(suffix)]
    return name


def test_selftest_checks_the_kernels_and_reports(tmp_path: Path) -> None:
    res = _run([*HIPRESS, "selftest", "--quick"], tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads((tmp_path / "hipress-results" / "selftest.json").read_text())
    assert report["ok"] and report["found"]["torch"] == torch.__version__
    checks = report["checks"]
    assert checks["C kernels = reference: onebit"] == "pass"
    if torch.cuda.is_available():
        assert checks["CUDA kernels = reference: onebit"] == "pass"
    else:
        assert checks["CUDA kernels on a GPU"].startswith("skipped: no GPU")
        assert checks["CUDA (emulated on the CPU) kernels = reference: dgc"] == "pass"
    assert checks["training over DDP"].startswith("skipped: run under torchrun")
    assert report["figures"] == {}
    assert set(report["speed"]["algorithms"]) >= {"onebit", "topk"}
    assert "selftest: every check that ran passed" in res.stdout


def test_selftest_under_torchrun_compresses_for_real(tmp_path: Path) -> None:
    rc, out, reports = _torchrun(2, tmp_path)
    assert rc == 0, out[-6000:]
    for report in reports:
        checks = _dist_checks(report)
        assert len(checks) == 6 and set(checks.values()) == {"pass"}, checks
        figures = report["figures"]
        for suffix in COMPRESSED:
            assert figures[_named(checks, suffix)]["compressed"] >= 1, figures
        ddp = figures[_named(checks, "onebit near DDP")]
        assert ddp["compressed"] == 2 and ddp["tensors"] == 6 and ddp["sent_ratio"] < 0.5, ddp
        fsdp = figures[_named(checks, REGISTER)]
        assert fsdp["compressed"] == fsdp["units"] == 2 and fsdp["compressed_calls"] > 0, fsdp
        direct = figures[_named(checks, "onebit/auto = reference")]
        assert direct["compressed_calls"] == 3, direct
    assert "ok   training (gloo on cpu, 2 ranks): onebit near DDP [compressed 2, tensors 6" in out
    assert f"ok   FSDP (gloo on cpu, 2 ranks): {REGISTER} [compressed 2, units 2" in out


def test_selftest_on_one_rank_calls_the_fsdp_reduce_scatter_directly(tmp_path: Path) -> None:
    rc, out, (report,) = _torchrun(1, tmp_path)
    assert rc == 0, out[-6000:]
    checks = _dist_checks(report)
    for suffix in COMPRESSED:
        name = _named(checks, suffix)
        assert checks[name] == "pass" and report["figures"][name]["compressed"] >= 1, name
    assert "(gloo on cpu, 1 rank)" in _named(checks, "onebit/auto = reference")
    skipped = checks[_named(checks, REGISTER)]
    assert skipped.startswith("skipped: FSDP2 calls no reduce-scatter on one rank"), skipped


def test_a_selftest_that_compresses_nothing_fails(tmp_path: Path) -> None:
    rc, out, reports = _torchrun(2, tmp_path, HIPRESS_SELFTEST_MIN_COMPRESS_NUMEL=str(10**9))
    assert rc != 0, out[-6000:]
    assert "selftest: FAILED" in out
    for report in reports:
        assert not report["ok"]
        checks = _dist_checks(report)
        assert checks[_named(checks, "uncompressed = DDP bit for bit")] == "pass"
        for suffix in (*COMPRESSED, REGISTER):
            name = _named(checks, suffix)
            assert checks[name].startswith("FAIL: AssertionError: "), checks[name]
            assert "compressed nothing" in checks[name] and "1000000000" in checks[name]
            assert report["figures"][name]["compressed"] == 0
    assert "[compressed 0, tensors 6" in out


def test_a_failed_check_is_reported_not_raised() -> None:
    from hipress.selftest import Report

    r = Report()
    r.check("fine", lambda: None)
    r.check("not here", lambda: "no GPU")
    r.check("broken", lambda: 1 / 0)
    assert r.checks == {"fine": "pass", "not here": "skipped: no GPU",
                        "broken": "FAIL: ZeroDivisionError: division by zero"}  # fmt: skip
    assert not r.ok


def test_the_report_prints_each_checks_figures() -> None:
    from hipress.selftest import Report, print_report

    r = Report(found={"torch": "x"})

    def measured() -> None:
        r.figures["measured"] = {"compressed": 0, "tensors": 6}
        raise AssertionError("compressed nothing")

    r.check("plain", lambda: None)
    r.check("measured", measured)
    buf = io.StringIO()
    print_report(r, buf)
    lines = buf.getvalue().splitlines()
    assert "  ok   plain" in lines
    assert ("  FAIL measured: FAIL: AssertionError: compressed nothing "
            "[compressed 0, tensors 6]") in lines  # fmt: skip


@pytest.mark.parametrize("text", ["many", "0", "-3", "1e9"])
def test_a_bad_threshold_in_the_environment_is_a_failed_check(text: str) -> None:
    from hipress.selftest import THRESHOLD_ENV, Report, _threshold

    r = Report()
    assert _threshold(r, text) is None
    assert r.checks[THRESHOLD_ENV] == f"FAIL: must be a whole number >= 1, got {text!r}"
    assert _threshold(r, "70000") == 70000


def test_the_kernels_are_built_up_front_on_parallel_threads(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """What the GPU path does before its kernel checks, here for the CPU: every algorithm's
    kernels built (in a fresh cache) before any check runs, the time reported."""
    from hipress.compll import algorithms
    from hipress.selftest import Report, _prepared_in_parallel

    monkeypatch.setenv("HIPRESS_CACHE_DIR", str(tmp_path))
    report = Report()
    get = _prepared_in_parallel(report, torch.device("cpu"))
    built = {p for p in tmp_path.rglob("*.so")}
    assert len(built) >= len(algorithms())
    assert "kernel build" in report.found
    x = torch.randn(1000)
    alg = get("onebit")
    alg.decode(alg.encode(x, alg.init_state(1000)), 1000)
    assert {p for p in tmp_path.rglob("*.so")} == built
