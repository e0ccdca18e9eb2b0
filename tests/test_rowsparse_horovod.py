"""Row-sparse entries over real Horovod: ``horovodrun -np 2 --gloo`` runs
tests/horovod_workers/check_rowsparse.py once; each test asserts its check passed on both ranks."""

from __future__ import annotations

from pathlib import Path

import pytest
from horovod_launch import launch, needs_horovod

WORKER = Path(__file__).parent / "horovod_workers" / "check_rowsparse.py"

pytestmark = needs_horovod


@pytest.fixture(scope="module")
def output() -> str:
    return launch(2, WORKER)


@pytest.mark.parametrize("check", ["exact_equals_horovod", "feedback_keeps_the_sum"])
def test_check_passed_on_both_ranks(output: str, check: str) -> None:
    for rank in (0, 1):
        assert f"[{rank}]<stdout>:CHECK {check} ok" in output, output[-4000:]
