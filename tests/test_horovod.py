"""hipress.horovod over real Horovod: ``horovodrun -np 2 --gloo`` on CPU.

One launch of tests/horovod_workers/check_optimizer.py runs every multi-process check (Horovod
starts in ~6 s, so the checks share it); each test below asserts that its check passed on both
ranks. The missing-Horovod test runs without Horovod, in a subprocess that blocks its import.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

WORKERS = Path(__file__).parent / "horovod_workers"
HOROVODRUN = Path(sys.executable).with_name("horovodrun")
NP = 2

needs_horovod = pytest.mark.skipif(
    importlib.util.find_spec("horovod") is None or not HOROVODRUN.exists(),
    reason=f"horovod is not installed (or no {HOROVODRUN}); run `bash .ci/horovod.sh "
    f"{sys.executable}` to build and install it",
)


@pytest.fixture(scope="module")
def worker_output() -> str:
    """Run the worker under horovodrun once; return its combined output."""
    cmd = [str(HOROVODRUN), "-np", str(NP), "-H", f"localhost:{NP}", "--gloo"]
    cmd += [sys.executable, str(WORKERS / "check_optimizer.py")]
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0 and "CHECK" not in out:
        pytest.fail(f"horovodrun exited {proc.returncode} before any check:\n{out[-4000:]}")
    return out


def _assert_check(output: str, name: str) -> None:
    ok = set(re.findall(rf"\[rank (\d+)\] CHECK {name} ok", output))
    if ok != {str(r) for r in range(NP)}:
        fails = re.findall(rf"CHECK {name} FAIL .*", output)
        pytest.fail(
            f"check {name} passed on ranks {sorted(ok)}; failures: {fails}\n{output[-3000:]}"
        )


@needs_horovod
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "check",
    [
        "uncompressed_equals_horovod",
        "horovod_call_forms",
        "compressed_equals_reference",
        "profile_over_horovod",
        "auto_plan",
        "backward_passes_per_step_2",
        "state_dict_roundtrip",
        "unsupported_options",
        "selection",
        "config_mismatch",
        "non_finite",
        "training_within_10_percent",
    ],
)
def test_horovod_check(worker_output: str, check: str) -> None:
    _assert_check(worker_output, check)


def test_missing_horovod_gives_install_hint() -> None:
    code = textwrap.dedent(
        """
        import sys
        sys.modules["horovod"] = None  # makes `import horovod...` raise ImportError
        import torch
        import hipress.horovod as hh
        opt = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
        try:
            hh.DistributedOptimizer(opt)
        except hh.HorovodNotInstalledError as exc:
            assert isinstance(exc, ImportError)
            print(exc)
        else:
            raise SystemExit("no error without horovod")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "pip install 'hipress[horovod]'" in proc.stdout
    assert ".ci/horovod.sh" in proc.stdout
