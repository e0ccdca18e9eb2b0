"""Run a multi-process launch (torchrun, a Lightning script) for a test, and never leave its
processes behind: the launch gets a session of its own, killed whole on timeout."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest


def run(cmd: Sequence[str], cwd: Path, what: str, timeout: float = 180,
        env: Mapping[str, str] | None = None) -> tuple[int, str]:  # fmt: skip
    """Run ``cmd`` in ``cwd``; return its exit status and output. Fails the test (with the
    output's tail) if it runs past ``timeout`` seconds, after killing every process it started."""
    proc = subprocess.Popen(
        list(cmd), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, env=None if env is None else dict(env),
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{what} ran past {timeout} s:\n{out[-6000:]}")
    return proc.returncode, out


def launch(cmd: Sequence[str], cwd: Path, what: str, timeout: float = 180,
           env: Mapping[str, str] | None = None) -> str:  # fmt: skip
    """:func:`run`, failing the test (with the output's tail) if ``cmd`` exits non-zero;
    returns its output."""
    rc, out = run(cmd, cwd, what, timeout, env)
    if rc != 0:
        pytest.fail(f"{what} exited {rc}:\n{out[-6000:]}")
    return out
