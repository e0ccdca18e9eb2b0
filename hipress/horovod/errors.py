"""Errors of the Horovod integration, and the one place that imports Horovod."""

from __future__ import annotations

import importlib
from typing import Any

from hipress.codec.errors import CaSyncError

__all__ = ["HorovodNotInstalledError", "HorovodSyncError", "import_horovod"]

INSTALL_HINT = (
    "hipress.horovod needs Horovod with its PyTorch and Gloo support: install the extra with "
    "`pip install 'hipress[horovod]'`, or build it like CI does with `bash .ci/horovod.sh "
    "<venv>/bin/python` (Horovod 0.28.1 needs a C++17 fix to build against torch 2.x; the "
    "script applies it and caches the wheel). Then launch with `horovodrun -np N --gloo python "
    "train.py`."
)


class HorovodSyncError(CaSyncError):
    """hipress.horovod was misused or misconfigured (an unsupported option, a bad call order)."""


class HorovodNotInstalledError(HorovodSyncError, ImportError):
    """``horovod.torch`` cannot be imported."""


def import_horovod() -> Any:
    """Return the ``horovod.torch`` module; raises :class:`HorovodNotInstalledError` (with the
    install hint) if it cannot be imported."""
    try:
        return importlib.import_module("horovod.torch")
    except ImportError as exc:
        raise HorovodNotInstalledError(f"{INSTALL_HINT}\n(import failed: {exc})") from exc
