"""Backend selection: which executor runs an algorithm's encode and decode.

- ``reference``: the reference interpreter (torch ops; any device; the definition).
- ``cpu``: the generated C kernel (:mod:`hipress.compll.backends.c.native`); compiled when loaded.
- ``cuda``: the generated CUDA kernel (:mod:`hipress.compll.backends.cuda.backend`); needs CuPy and a GPU.
- ``auto``: per call, by the device of the tensors: CPU tensors run the C kernel, CUDA tensors
  the CUDA kernel, anything else the reference; each built at its first call, or before it by
  ``Algorithm.build_kernels(device)`` (CaSync, FSDP and Horovod registration call it). Where the C
  kernel cannot run (no C compiler), the reference runs instead, after one
  :class:`NativeUnavailableWarning`; an explicit ``cpu`` raises :class:`BackendError` instead. CUDA tensors never fall back: if the CUDA kernel cannot run
  (no CuPy, a CuPy built for a newer CUDA than the driver), the call raises
  :class:`~hipress.compll.backends.base.BackendError` naming the cause and the fix; the reference
  on a GPU would be orders of magnitude slower, silently.
"""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from hipress.compll.backends.base import Backend, BackendError, ReferenceBackend
from hipress.compll.backends.cache import (
    C_COMPILERS,
    KernelCache,
    Toolchain,
    missing_compiler,
)
from hipress.compll.ir import nodes as ir
from hipress.compll.ir.state import State

log = logging.getLogger(__name__)

BACKENDS = ("auto", "cpu", "cuda", "reference")


class NativeUnavailableWarning(RuntimeWarning):
    """A generated kernel cannot run here; the (slower) reference interpreter runs instead."""


_PACKAGE = str(Path(__file__).resolve().parents[2])  # the hipress package's folder


def _caller_outside_hipress() -> int:
    """The ``stacklevel`` for :func:`warnings.warn`, called right here, of the innermost frame
    outside the hipress package: a warning points at the user's line, not into hipress."""
    level, frame = 1, sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        level, frame = level + 1, frame.f_back
    return level


def _warn_fallback(what: str, why: str) -> None:
    warnings.warn(
        f"hipress: the {what} kernel is unavailable ({why}); falling back to the reference "
        "interpreter, which computes the same result much more slowly",
        NativeUnavailableWarning,
        stacklevel=_caller_outside_hipress(),
    )


def cpu_backend(
    program: ir.Program, cache: KernelCache | None = None, *, strict: bool = False
) -> Backend:
    """The C backend for ``program``. Without a working C compiler: :class:`BackendError` if
    ``strict`` (``backend="cpu"`` asked for it), else the reference after one warning."""
    from hipress.compll.backends.c.native import NativeBackend

    tc = Toolchain.detect()
    if tc is None:
        why = missing_compiler(None, "CC", C_COMPILERS)
        if strict:
            raise BackendError(
                f"backend='cpu' needs a C compiler: {why} (backend='auto' runs the reference "
                "interpreter instead, much more slowly)"
            )
        _warn_fallback("C", why)
        return ReferenceBackend(program)
    return NativeBackend(program, cache, tc)


def strict_cpu_backend(program: ir.Program) -> Backend:
    """``backend="cpu"``: the C backend, or :class:`BackendError` saying why it cannot run."""
    return cpu_backend(program, strict=True)


def cuda_backend(program: ir.Program) -> Backend:
    """The CUDA backend for ``program``; raises :class:`BackendError` if it cannot run here."""
    from hipress.compll.backends.cuda.backend import CudaBackend, CudaUnavailable

    try:
        return CudaBackend(program)
    except CudaUnavailable as exc:
        raise BackendError(f"the CUDA backend cannot run here: {exc}") from None


class AutoBackend:
    """Picks the backend per call from the device of the gradient / payload."""

    name = "auto"

    def __init__(self, program: ir.Program, cache: KernelCache | None = None) -> None:
        self.program = program
        self.cache = cache
        self.reference = ReferenceBackend(program)
        self._cpu: Backend | None = None
        self._cuda: Backend | None = None

    def backend_for(self, device: torch.device) -> Backend:
        """The backend that runs tensors on ``device`` (built on first use)."""
        if device.type == "cpu":
            if self._cpu is None:
                self._cpu = cpu_backend(self.program, self.cache)
            return self._cpu
        if device.type == "cuda":
            if self._cuda is None:
                self._cuda = cuda_backend(self.program)
            return self._cuda
        return self.reference

    def prepare(self, device: torch.device) -> None:
        """Build (compile, load) the backend for ``device`` now rather than at its first call:
        on a CUDA device, for that device's architecture."""
        if device.type == "cuda" and self._cuda is None and torch.cuda.is_available():
            with torch.cuda.device(device):
                backend = self.backend_for(device)
        else:
            backend = self.backend_for(device)
        prep = getattr(backend, "prepare", None)
        if prep is not None:
            prep(device)

    def encode(
        self, grad: torch.Tensor, state: State, out: torch.Tensor
    ) -> bool | torch.Tensor | None:
        return self.backend_for(grad.device).encode(grad, state, out)

    def decode(self, payload: torch.Tensor, n: int, out: torch.Tensor, accumulate: bool) -> None:
        self.backend_for(payload.device).decode(payload, n, out, accumulate)

    def decode_sum(
        self, payloads: Sequence[torch.Tensor], n: int, out: torch.Tensor, divisor: float
    ) -> None:
        self.backend_for(payloads[0].device).decode_sum(payloads, n, out, divisor)


def factories() -> dict[str, Callable[[ir.Program], Backend]]:
    """Backend name -> constructor."""
    return {
        "auto": AutoBackend,
        "cpu": strict_cpu_backend,
        "cuda": cuda_backend,
        "reference": ReferenceBackend,
    }


def resolve_backend(name: str, program: ir.Program) -> Backend:
    """The backend called ``name`` for ``program``; :class:`BackendError` if unknown."""
    table = factories()
    if name not in table:
        raise BackendError(f"unknown backend {name!r} (backends: {', '.join(BACKENDS)})")
    return table[name](program)
