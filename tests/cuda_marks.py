"""The mark of tests that compile CUDA sources with NVRTC (no GPU needed)."""

from __future__ import annotations

import pytest


def nvrtc_ok() -> bool:
    """Whether NVRTC loads here."""
    try:
        from hipress.compll.backends.cuda.backend import CudaUnavailable
        from hipress.compll.backends.cuda.nvrtc import _nvrtc
    except ImportError:
        return False
    try:
        _nvrtc()
        return True
    except CudaUnavailable:
        return False


needs_nvrtc = pytest.mark.skipif(not nvrtc_ok(), reason="NVRTC not installed")
