"""What runs generated CUDA kernels: a :class:`Runtime`, and the host steps every runtime shares.

:class:`~hipress.compll.backends.cuda.backend.CudaBackend` decides everything (workspace layout, argument structs,
launch order, host steps); a runtime only loads a rendered source and launches its kernels on the
tensors' device, in stream order:

- :class:`CupyRuntime`: kernels compiled by hipress's own NVRTC call
  (:mod:`~hipress.compll.backends.cuda.nvrtc`, with its options and nothing else), loaded and
  launched through CuPy, on CUDA tensors, on torch's current stream of the tensors' device (the
  GPU path).
- :class:`~hipress.compll.backends.cuda.emu.EmulatedRuntime`: the same source compiled as C++ and run on
  the CPU, on CPU tensors (the CI path; see that module).

Device memory is always torch's (workspaces, sort and top-k buffers): nothing is allocated behind
torch's caching allocator. Sort and top-k (:func:`select_topk`, :func:`stable_sort`) are torch
ops on the device, ordered on the same stream as the kernels.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Protocol

import torch

from hipress.compll.backends.cache import KernelCache
from hipress.compll.backends.cuda.abi import NT, CudaSource, Field
from hipress.compll.backends.cuda.nvrtc import NVRTC_OPTIONS, CudaUnavailable, device_image


class Runtime(Protocol):
    """Loads rendered CUDA sources and launches their kernels (see module doc)."""

    name: str
    device_type: str  # the torch device type of the tensors it runs on

    def load(self, src: CudaSource) -> Any:
        """A handle to ``src``'s compiled kernels (compiled now, for the current device)."""
        ...

    def prepare(self, module: Any, device: torch.device) -> None:
        """Make ``module``'s kernels ready to launch on ``device`` now (compile, load)."""
        ...

    def launch(self, module: Any, kernel: str, grid: int, block: int, args: bytes,
               fields: Sequence[Field], device: torch.device) -> None:  # fmt: skip
        """Run ``kernel`` on ``grid`` blocks of ``block`` threads with the argument struct
        ``args`` (packed, laid out as ``fields``), after the work already queued on the
        current stream of ``device``."""
        ...

    def grid(self, n: int, device: torch.device) -> int:
        """Blocks for a launch over ``n`` elements."""
        ...

    def stream_key(self, device: torch.device) -> Hashable:
        """Calls with equal keys are ordered (one stream); buffers are kept per key."""
        ...


# ---------------------------------------------------------------- buffers


class BufferPool:
    """Device buffers by key, the least recently used dropped beyond ``max_entries``.

    Keys include the stream (:meth:`Runtime.stream_key`): a buffer is only ever used by work on
    one stream, so calls on two streams never share one, and torch's caching allocator reuses a
    dropped buffer only in that stream's order."""

    def __init__(self, max_entries: int = 32) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self._bufs: OrderedDict[Hashable, torch.Tensor] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, make: Callable[[], torch.Tensor]) -> torch.Tensor:
        with self._lock:
            buf = self._bufs.get(key)
            if buf is not None:
                self._bufs.move_to_end(key)
                return buf
        buf = make()
        with self._lock:
            self._bufs[key] = buf
            while len(self._bufs) > self.max_entries:
                self._bufs.popitem(last=False)
        return buf

    def __len__(self) -> int:
        return len(self._bufs)

    def nbytes(self) -> int:
        """Bytes held."""
        with self._lock:
            return sum(b.numel() * b.element_size() for b in self._bufs.values())


# ---------------------------------------------------------------- host steps


def ordered_keys(raw: torch.Tensor, kbits: int) -> torch.Tensor:
    """The unsigned ``kbits``-bit keys in ``raw`` (bytes) as int64 that order the same way."""
    if kbits == 32:
        return raw.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    return raw.view(torch.int64) ^ torch.iinfo(torch.int64).min


def select_topk(raw: torch.Tensor, kbits: int, length: int, k: int, out: torch.Tensor) -> None:
    """``out`` (int32, k elements) = the indices of the ``min(k, length)`` smallest keys in
    ``raw`` (``length`` unsigned keys of ``kbits`` bits; ties to the lower index), ascending,
    then zeros: what a stable sort of the keys, taking the first k, gives, without sorting.
    Torch ops on ``raw``'s device; no host synchronisation."""
    take = min(k, length)
    if take < k:
        out[take:].zero_()
    if take == 0:
        return
    if take == length:
        torch.arange(length, dtype=torch.int32, device=raw.device, out=out[:take])
        return
    if kbits == 32:
        # unique keys (key, index): the `take` smallest are exactly the set wanted
        key = ordered_keys(raw, 32).bitwise_left_shift_(32)
        key |= torch.arange(length, device=raw.device)
        key ^= torch.iinfo(torch.int64).min  # the unsigned order, as signed
        sel = torch.topk(key, take, largest=False, sorted=False).values & 0xFFFFFFFF
        out[:take].copy_(torch.sort(sel).values)
        return
    key = ordered_keys(raw, kbits)
    thr = torch.topk(key, take, largest=False, sorted=False).values.max()
    less = key < thr
    eq = key == thr
    need = take - less.sum()
    mask = less | (eq & (torch.cumsum(eq, 0) <= need))
    # the selected indices in order, by position (the others all go to a spare last slot)
    slot = torch.where(mask, torch.cumsum(mask, 0) - 1, take)
    buf = torch.empty(take + 1, dtype=torch.int64, device=raw.device)
    buf.scatter_(0, slot, torch.arange(length, device=raw.device))
    out[:take].copy_(buf[:take])


def stable_sort(raw: torch.Tensor, kbits: int, vals: torch.Tensor, out: torch.Tensor) -> None:
    """``out`` = ``vals`` in the stable order of the unsigned ``kbits``-bit keys in ``raw``."""
    order = torch.sort(ordered_keys(raw, kbits), stable=True).indices
    torch.index_select(vals, 0, order, out=out)


# ---------------------------------------------------------------- CuPy on a GPU


def _cupy() -> Any:
    try:
        import cupy as cp  # type: ignore[import-not-found]
    except ImportError as exc:
        raise CudaUnavailable(
            f"CuPy is not installed ({exc}); pip install 'hipress[cuda]' (CUDA 13 driver) or "
            "'hipress[cuda12]' (CUDA 12 driver)"
        ) from None
    try:
        count = cp.cuda.runtime.getDeviceCount()
    except cp.cuda.runtime.CUDARuntimeError as exc:
        raise CudaUnavailable(_driver_advice(cp, exc)) from None
    if count < 1:
        raise CudaUnavailable("CuPy sees no CUDA device")
    return cp


def _driver_advice(cp: Any, exc: Exception) -> str:
    """Why CuPy cannot use the GPU, and the fix (usually: a wheel for a newer CUDA than the
    driver supports)."""
    try:
        driver = cp.cuda.runtime.driverGetVersion()
        built = cp.cuda.runtime.runtimeGetVersion()
    except Exception:  # no driver at all
        return f"no usable CUDA driver ({exc})"
    if driver < built:
        d, b = f"{driver // 1000}.{driver % 1000 // 10}", f"{built // 1000}.{built % 1000 // 10}"
        extra = "cuda12" if driver // 1000 == 12 else "cuda"
        return (
            f"the NVIDIA driver supports CUDA {d}, but the installed CuPy is built for CUDA {b} "
            f"({exc}); pip uninstall cupy-cuda{built // 1000}x && pip install 'hipress[{extra}]', "
            "or update the driver"
        )
    return f"no usable CUDA device ({exc})"


class CupyModule:
    """One rendered source's kernels on the GPUs of a process: the image compiled once per
    compute capability (:func:`~hipress.compll.backends.cuda.nvrtc.device_image`, through the
    kernel cache), loaded into a device's context the first time that device needs it."""

    def __init__(self, src: CudaSource, cache: KernelCache) -> None:
        self.src = src
        self.cache = cache
        self._images: dict[tuple[int, int], bytes] = {}
        self._modules: dict[int, Any] = {}
        self._lock = threading.Lock()

    def image(self, capability: tuple[int, int]) -> bytes:
        img = self._images.get(capability)
        if img is None:
            img = device_image(self.src.source, capability, "kernels.cu", self.cache)
            self._images[capability] = img
        return img

    def on(self, cp: Any, idx: int) -> Any:
        """The CuPy module loaded on device ``idx`` (compiled and loaded on first use)."""
        mod = self._modules.get(idx)
        if mod is None:
            with self._lock:
                mod = self._modules.get(idx)
                if mod is None:
                    img = self.image(torch.cuda.get_device_capability(idx))
                    with cp.cuda.Device(idx):
                        mod = cp.cuda.function.Module()
                        mod.load(img)
                    self._modules[idx] = mod
        return mod


class CupyRuntime:
    """Kernels compiled by hipress's NVRTC call (:data:`NVRTC_OPTIONS`: IEEE float32, no
    flush-to-zero) and launched through CuPy on torch's current stream. ``cache``: where
    compiled images are kept (default: the user's kernel cache)."""

    name = "cupy"
    device_type = "cuda"
    blocks_per_sm = 8  # 8 blocks of 256 threads fill an SM

    def __init__(self, cache: KernelCache | None = None) -> None:
        self.cp = _cupy()
        self.cache = cache or KernelCache.from_env()
        self._functions: dict[tuple[int, int, str], Any] = {}
        self._sms: dict[int, int] = {}
        self._dtypes: dict[int, Any] = {}
        self._streams: dict[tuple[int, int], Any] = {}

    def load(self, src: CudaSource, device: torch.device | None = None) -> CupyModule:
        """``src``'s kernels, compiled (or found in the cache) and loaded on ``device`` (default:
        torch's current CUDA device) now, so that no launch compiles."""
        module = CupyModule(src, self.cache)
        idx = device.index if device is not None and device.index is not None else None
        module.on(self.cp, idx if idx is not None else torch.cuda.current_device())
        return module

    def prepare(self, module: CupyModule, device: torch.device) -> None:
        """Compile and load ``module`` for ``device`` now (a no-op where it is loaded)."""
        module.on(self.cp, device.index if device.index is not None else
                  torch.cuda.current_device())  # fmt: skip

    def launch(self, module: CupyModule | Any, kernel: str, grid: int, block: int, args: bytes,
               fields: Sequence[Field], device: torch.device) -> None:  # fmt: skip
        import numpy as np

        cp = self.cp
        idx = device.index if device.index is not None else torch.cuda.current_device()
        dt = self._dtypes.get(len(args))
        if dt is None:
            # the struct as CuPy passes a user type by value: a 1-element structured array
            k = len(args) // 8
            dt = self._dtypes[len(args)] = np.dtype({
                "names": [f"f{j}" for j in range(k)], "formats": ["<u8"] * k,
                "offsets": [8 * j for j in range(k)], "itemsize": len(args),
            })  # fmt: skip
        arg = np.frombuffer(args, dtype=dt).copy()
        with cp.cuda.Device(idx):
            key = (id(module), idx, kernel)
            fn = self._functions.get(key)
            if fn is None:
                # (a CuPy module loaded elsewhere, e.g. by a subclass's load, runs as it is)
                mod = module.on(cp, idx) if isinstance(module, CupyModule) else module
                fn = self._functions[key] = mod.get_function(kernel)
            ptr = torch.cuda.current_stream(idx).cuda_stream
            stream = self._streams.get((idx, ptr))
            if stream is None:
                stream = self._streams[(idx, ptr)] = cp.cuda.ExternalStream(ptr, idx)
            with stream:
                fn((grid,), (block,), (arg,))

    def grid(self, n: int, device: torch.device) -> int:
        idx = device.index if device.index is not None else torch.cuda.current_device()
        if idx not in self._sms:
            self._sms[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
        return max(1, min(self._sms[idx] * self.blocks_per_sm, -(-n // NT)))

    def stream_key(self, device: torch.device) -> Hashable:
        idx = device.index if device.index is not None else torch.cuda.current_device()
        return ("cuda", idx, torch.cuda.current_stream(idx).cuda_stream)


__all__ = [
    "NVRTC_OPTIONS", "BufferPool", "CudaUnavailable", "CupyModule", "CupyRuntime", "Runtime", "select_topk",
    "stable_sort",
]  # fmt: skip
