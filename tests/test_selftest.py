"""``hipress selftest``: the CPU half here (kernels against the reference, the emulated CUDA
kernels, speed), the DDP half under torchrun with gloo; on a GPU (marked cuda) all of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HIPRESS = [sys.executable, "-m", "hipress"]


def _run(cmd: list[str], tmp_path: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=tmp_path,
                          env=env, check=False)  # fmt: skip


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
    assert set(report["speed"]["algorithms"]) >= {"onebit", "topk"}
    assert "selftest: every check that ran passed" in res.stdout


def test_selftest_under_torchrun_trains_with_the_hook(tmp_path: Path) -> None:
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun not installed next to this Python")
    res = _run([str(torchrun), "--standalone", "--nproc-per-node", "2", "-m",
                "hipress", "selftest", "--quick"], tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    for rank in (0, 1):
        report = json.loads(
            (tmp_path / "hipress-results" / f"selftest-rank{rank}.json").read_text()
        )
        training = {k: v for k, v in report["checks"].items() if k.startswith("training")}
        assert len(training) == 2 and set(training.values()) == {"pass"}, training


def test_a_failed_check_is_reported_not_raised() -> None:
    from hipress.selftest import Report

    r = Report()
    r.check("fine", lambda: None)
    r.check("not here", lambda: "no GPU")
    r.check("broken", lambda: 1 / 0)
    assert r.checks == {"fine": "pass", "not here": "skipped: no GPU",
                        "broken": "FAIL: ZeroDivisionError: division by zero"}  # fmt: skip
    assert not r.ok
