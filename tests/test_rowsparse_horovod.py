"""Row-sparse entries over real Horovod: ``horovodrun -np 2 --gloo`` runs
tests/horovod_workers/check_rowsparse.py once; each test asserts its check passed on both ranks."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).parent / "horovod_workers" / "check_rowsparse.py"
HOROVODRUN = Path(sys.executable).with_name("horovodrun")

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("horovod") is None or not HOROVODRUN.exists(),
    reason=f"horovod is not installed (or no {HOROVODRUN})",
)


@pytest.fixture(scope="module")
def output() -> str:
    cmd = [str(HOROVODRUN), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, str(WORKER)]
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    return proc.stdout + proc.stderr


@pytest.mark.parametrize("check", ["exact_equals_horovod", "feedback_keeps_the_sum"])
def test_check_passed_on_both_ranks(output: str, check: str) -> None:
    for rank in (0, 1):
        assert f"[{rank}]<stdout>:CHECK {check} ok" in output, output[-4000:]
