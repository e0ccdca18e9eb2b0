"""Run a script under ``horovodrun --gloo`` for a test and read the checks its ranks report:
each rank prints ``[rank R] CHECK name ok`` (or ``CHECK name FAIL ...``) for every check."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

HOROVODRUN = Path(sys.executable).with_name("horovodrun")

needs_horovod = pytest.mark.skipif(
    importlib.util.find_spec("horovod") is None or not HOROVODRUN.exists(),
    reason=f"horovod is not installed (or no {HOROVODRUN}); run `bash .ci/horovod.sh "
    f"{sys.executable}` to build and install it",
)


def launch(n: int, script: Path | str, *args: str, timeout: float = 240) -> str:
    """Run ``script`` with ``args`` on ``n`` local Horovod ranks; return the combined output.
    Fails the test if horovodrun exits non-zero before any rank reported a check."""
    cmd = [str(HOROVODRUN), "-np", str(n), "-H", f"localhost:{n}", "--gloo", sys.executable,
           str(script), *args]  # fmt: skip
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0 and "CHECK" not in out:
        pytest.fail(f"horovodrun exited {proc.returncode} before any check:\n{out[-4000:]}")
    return out


def assert_checked(out: str, check: str, n: int) -> None:
    """Fail unless every one of the ``n`` ranks reported ``check`` ok in ``out``."""
    ok = set(re.findall(rf"\[rank (\d+)\] CHECK {check} ok", out))
    if ok != {str(r) for r in range(n)}:
        fails = re.findall(rf"CHECK {check} FAIL .*", out)
        pytest.fail(f"check {check} passed on ranks {sorted(ok)}; failures: {fails}\n{out[-3000:]}")
