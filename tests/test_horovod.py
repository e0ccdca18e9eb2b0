"""hipress.horovod over real Horovod: ``horovodrun -np 2 --gloo`` on CPU.

One launch of tests/horovod_workers/check_optimizer.py runs every multi-process check (Horovod
starts in ~6 s, so the checks share it); each test below asserts that its check passed on both
ranks. The missing-Horovod test runs without Horovod, in a subprocess that blocks its import.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from horovod_launch import assert_checked, launch, needs_horovod

WORKERS = Path(__file__).parent / "horovod_workers"
NP = 2


@pytest.fixture(scope="module")
def worker_output() -> str:
    """Run the worker under horovodrun once; return its combined output."""
    return launch(NP, WORKERS / "check_optimizer.py")


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
    assert_checked(worker_output, check, NP)


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
