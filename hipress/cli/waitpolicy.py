"""OpenMP's wait policy for the commands that time CPU kernels (``hipress bench kernels``,
``hipress plan`` and ``hipress profile`` when they measure encode and decode).

libgomp reads ``OMP_WAIT_POLICY`` once, when torch loads it. Its default spins before sleeping,
so on a machine whose cores are shared with other processes every parallel region waits for a
spinning or descheduled thread, which can slow a kernel by an order of magnitude and make a
plan that compresses nothing. Training jobs on shared cores are advised to run with
``PASSIVE``; these commands measure the same way: run as ``hipress`` (or ``python -m
hipress``) without the variable, they execute themselves again with ``PASSIVE`` before
timing; called in-process (``hipress.cli.main([...])``) they cannot, and warn instead.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NoReturn, TextIO

__all__ = ["VARIABLE", "before_timing", "reexec_passive", "started_as_hipress"]

VARIABLE = "OMP_WAIT_POLICY"


def started_as_hipress() -> bool:
    """Whether this process is the ``hipress`` command itself (its console script, or
    ``python -m hipress``), the only case in which executing it again re-runs the command and
    nothing else of a caller's program."""
    first = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path()
    if first.name == "__main__.py":
        return first.parent.name == "hipress"
    return first.name == "hipress"


def reexec_passive(command: str, out: TextIO | None = None) -> NoReturn:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` and execute this process's command again (the
    ``hipress`` script or ``python -m hipress``, with the same arguments), saying so on
    ``out`` (default: stdout) as ``[command] re-running with ...``. Never returns."""
    os.environ[VARIABLE] = "PASSIVE"
    print(f"[{command}] re-running with {VARIABLE}=PASSIVE", file=out or sys.stdout, flush=True)
    argv = sys.orig_argv if Path(sys.argv[0]).name == "__main__.py" else [sys.executable, *sys.argv]
    os.execv(sys.executable, argv)


def before_timing(command: str, *, may_reexec: bool, err: TextIO) -> None:
    """Call before timing CPU kernels. Nothing happens if ``OMP_WAIT_POLICY`` is set (the
    user chose); else, with ``may_reexec`` (the process runs the command line itself), this
    re-executes it with ``PASSIVE`` (:func:`reexec_passive`, saying so on ``err``), and
    without it warns on ``err`` that the timings may be slowed by active waiting."""
    if VARIABLE in os.environ:
        return
    if may_reexec:
        reexec_passive(command, err)
    print(
        f"warning: {command} times kernels with OpenMP's default active wait ({VARIABLE} is "
        "not set): on a machine whose cores are busy, the timings (and a plan made from them) "
        f"can be an order of magnitude off; set {VARIABLE}=PASSIVE before starting Python, as "
        "the `hipress` command does for itself, or time with --threads 1",
        file=err,
    )
