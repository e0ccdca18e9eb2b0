"""Run a multi-process launch (torchrun, a Lightning script) for a test, and never leave its
processes behind: the launch gets a session of its own, killed whole on timeout."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
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


def run_ranks(script: Sequence[str], cwd: Path, what: str, world_size: int = 2,
              timeout: float = 180) -> tuple[int, str]:  # fmt: skip
    """Start ``python script...`` once per rank, each an independent process with the
    environment a cluster's launcher gives (``MASTER_ADDR``/``MASTER_PORT`` on a free port,
    ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``): no launcher watches them, so a rank that exits
    leaves the others running, as on separate machines. Returns rank 0's exit status and every
    rank's output (rank 0's first); fails the test past ``timeout`` seconds, as :func:`run`."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    py = " ".join(shlex.quote(a) for a in [sys.executable, *script])
    rest = " ".join(
        f"RANK={r} LOCAL_RANK={r} {py} > rank{r}.log 2>&1 &" for r in range(1, world_size)
    )
    shell = f"{rest} RANK=0 LOCAL_RANK=0 {py} > rank0.log 2>&1; rc=$?; wait; exit $rc"
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "WORLD_SIZE": str(world_size), "NODE_RANK": "0"}  # fmt: skip
    rc, _ = run(["sh", "-c", shell], cwd, what, timeout, env)
    logs = [(cwd / f"rank{r}.log").read_text(errors="replace") for r in range(world_size)]
    return rc, "\n".join(logs)
