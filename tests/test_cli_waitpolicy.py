"""``hipress plan`` and ``hipress profile`` time kernels under OpenMP's passive wait, as
``hipress bench kernels`` does (:mod:`hipress.cli.waitpolicy`), or say that they cannot."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hipress.cli import main
from hipress.secopa.model.profile import Profile

PROFILE = ["profile", "--algorithm", "onebit", "--bandwidth", "1gbit", "--budget", "0.1"]


def test_the_command_runs_itself_again_with_the_passive_wait(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = tmp_path / "p.json"
    proc = subprocess.run([sys.executable, "-m", "hipress", *PROFILE, "--out", str(out)],
                          capture_output=True, text=True, env=env, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("[hipress profile] re-running with OMP_WAIT_POLICY=PASSIVE") == 1
    assert "warning: hipress profile times kernels" not in proc.stderr
    assert Profile.load(out).algorithm == "onebit"


def test_in_process_it_warns_and_a_chosen_policy_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert main([*PROFILE, "--out", str(tmp_path / "a.json")]) == 0
    err = capsys.readouterr().err
    assert "warning: hipress profile times kernels with OpenMP's default active wait" in err
    assert "set OMP_WAIT_POLICY=PASSIVE" in err and "--threads 1" in err
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # the user's choice: no warning, no re-run
    assert main([*PROFILE, "--out", str(tmp_path / "b.json")]) == 0
    assert "OMP_WAIT_POLICY" not in capsys.readouterr().err
