"""What every result file records about its run: the commit of the code, the machine and the
command, so a reference result in ``docs/results/`` says where its figures came from."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

import torch

__all__ = ["commit", "cpu_name", "machine", "stamp"]


def commit() -> str | None:
    """The git commit of the checkout hipress runs from (``+dirty`` when it has uncommitted
    changes), or None for an installed package outside a checkout."""
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"],
                             capture_output=True, text=True, timeout=10, check=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "-C", str(here), "diff", "--quiet", "HEAD"],
                               capture_output=True, timeout=30, check=False).returncode  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("+dirty" if dirty else "") if sha else None


def cpu_name() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what :mod:`platform` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    """The host: CPU, core count, OS, Python and torch versions, the GPU if torch sees one."""
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {
        "cpu": cpu_name(),
        "cpus": os.cpu_count(),
        "system": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "gpu": gpu,
    }


def stamp(results: dict[str, Any], command: str) -> dict[str, Any]:
    """``results`` with ``commit``, ``machine`` (merged into an existing ``machine`` entry),
    ``command`` and ``created`` set at the top level; returns the same dict."""
    results["commit"] = commit()
    results["machine"] = machine() | dict(results.get("machine") or {})
    results["command"] = command
    results.setdefault("created", time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    return results
