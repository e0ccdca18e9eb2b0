"""hipress: compression-aware data-parallel training for PyTorch.

Three parts:

- :mod:`hipress.compll` -- a small DSL for gradient-compression algorithms, its checker, IR,
  reference interpreter and generated kernels.
- :mod:`hipress.secopa` -- a measured cost model that plans, per tensor, whether and how to
  compress.
- :mod:`hipress.casync` -- compression-aware synchronisation on ``torch.distributed`` (a DDP
  communication hook).

The subpackages load on first use (``import hipress; hipress.casync.register(...)``), and
:func:`register` (:func:`hipress.casync.register`) is here too.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_SUBPACKAGES = ("casync", "compll", "core", "horovod", "secopa")
_FROM_CASYNC = ("register", "CaSyncState", "casync_hook")


def __getattr__(name: str) -> Any:
    """Import a subpackage, or take a name of :mod:`hipress.casync`, at first use (``import
    hipress`` alone stays light: no torch)."""
    if name in _SUBPACKAGES:
        return importlib.import_module(f"hipress.{name}")
    if name in _FROM_CASYNC:
        return getattr(importlib.import_module("hipress.casync"), name)
    raise AttributeError(f"module 'hipress' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_SUBPACKAGES, *_FROM_CASYNC})
