"""The CUDA emulation runtime: the generated CUDA C run on the CPU, byte for byte the GPU's work.

:class:`EmulatedRuntime` compiles the exact rendered ``.cu`` source as C++ with a small
compatibility header (``cuda_emu.h``: ``__shared__``, ``__syncthreads()``, thread and block
indices, the bit casts and atomics the kernels use) and runs each block's threads as fibers that
switch at ``__syncthreads()``, blocks one after another. The launch code above it (workspace
layout, argument structs, launch order, sort and top-k) is the GPU path's own
(:class:`~hipress.compll.backends.cuda.backend.CudaBackend`), so the CI's comparison of these kernels with the
reference interpreter checks what a GPU runs, less the hardware's concurrency.

It reports a barrier reached by only some threads of a block as an :class:`EmulationError`, and
with ``shuffle`` runs threads (per barrier phase) and blocks in a seeded random order, so that a
missing barrier gives a wrong result. With ``ftz`` float32 denormals are flushed to zero, as
inputs and as results, as a GPU's ``.ftz`` instructions do (the CPU's flush-to-zero and
denormals-are-zero modes during each launch): what a kernel compiled with ``-ftz=true`` would
compute, so tests can show that the comparison with the reference catches it. Under AddressSanitizer or UBSan's alignment check
(``sanitize=("address",)``, ``("alignment",)``; docs/how-to/write-an-algorithm.md)
out-of-bounds and misaligned accesses are caught too.

Tensors are CPU tensors ("device" memory is host memory). Kernels are cached like the C
target's (:class:`~hipress.compll.backends.cache.KernelCache`), keyed by source, header and compiler.
"""

from __future__ import annotations

import ctypes
import hashlib
import subprocess
import tempfile
import threading
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from hipress.compll.backends.cache import CompileError, KernelCache, find_compiler
from hipress.compll.backends.cuda.abi import NT, CudaSource, Field
from hipress.compll.backends.libload import KEY_SYMBOL, key_definition, load_checked
from hipress.compll.backends.text import explain
from hipress.compll.ir.source import CllError

CXX_FLAGS = ("-O2", "-std=c++17", "-fPIC", "-shared", "-ffp-contract=off", "-fno-math-errno",
             "-w")  # fmt: skip
SANITIZERS = {
    "address": ("-fsanitize=address", "-fno-omit-frame-pointer"),
    "alignment": ("-fsanitize=alignment", "-fno-sanitize-recover=alignment"),
}
GPU_BLOCKS = 132 * 8  # the grid an H100 (132 SMs) launches at most: blocks=None emulates it


class EmulationError(CllError):
    """An emulated kernel did something a GPU would not survive or would compute wrongly (a
    barrier reached by only some threads of a block)."""

    kind = "cuda emulation error"


@dataclass(frozen=True)
class CxxToolchain:
    """A C++ compiler (``$CXX``, else ``c++``/``g++``/``clang++``) and its version banner."""

    cxx: str
    version: str

    @classmethod
    def detect(cls, environ: Mapping[str, str] | None = None) -> CxxToolchain | None:
        found = find_compiler(environ, "CXX", ("c++", "g++", "clang++"))
        return cls(*found) if found else None


def _header() -> str:
    return resources.files("hipress.compll.backends.cuda").joinpath("emu.h").read_text()


def emulation_source(src: CudaSource) -> str:
    """``src``'s CUDA source with an entry per kernel taking a pointer to its struct."""
    entries = [
        f'extern "C" void hp_emu_k_{k}(const void* a) {{ {k}(*(const {s}*)a); }}'
        for k, s in src.kernels.items()
    ]
    return src.source + "\n/* hipress CUDA emulation: entries */\n" + "\n".join(entries) + "\n"


class _Module:
    def __init__(self, lib: ctypes.CDLL, kernels: Sequence[str]) -> None:
        self.lib = lib
        self.entries = {k: ctypes.cast(getattr(lib, f"hp_emu_k_{k}"), ctypes.c_void_p).value
                        for k in kernels}  # fmt: skip
        fn = lib.hp_emu_launch
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint,
                       ctypes.c_ulonglong, ctypes.c_int, ctypes.c_int, ctypes.c_char_p,
                       ctypes.c_int]  # fmt: skip
        self.launch = fn


class EmulatedRuntime:
    """Runs generated CUDA kernels on the CPU (see module doc).

    Args:
        blocks: grid size of every launch (None: as a GPU would size it, up to an H100's).
        shuffle: run blocks and threads in a seeded random order (else forward).
        seed: seed of the orders (each launch draws its own from it).
        ftz: flush float32 denormals to zero, as a GPU's ``.ftz`` instructions do (x86-64 and
            AArch64 CPUs).
        cache: where compiled kernels are kept (default: the C target's cache).
        toolchain: the C++ compiler (default: :meth:`CxxToolchain.detect`).
        sanitize: "address" and/or "alignment" (needs the sanitizer runtime preloaded: see
            docs/how-to/write-an-algorithm.md).
    """

    name = "emulated"
    device_type = "cpu"

    def __init__(self, blocks: int | None = 3, shuffle: bool = False, seed: int = 0,
                 cache: KernelCache | None = None, toolchain: CxxToolchain | None = None,
                 sanitize: Sequence[str] = (), ftz: bool = False) -> None:  # fmt: skip
        if blocks is not None and blocks < 1:
            raise ValueError("blocks must be at least 1")
        bad = sorted(set(sanitize) - set(SANITIZERS))
        if bad:
            raise ValueError(f"unknown sanitizer {bad[0]!r} (known: {', '.join(SANITIZERS)})")
        tc = toolchain or CxxToolchain.detect()
        if tc is None:
            raise EmulationError("no C++ compiler found (set $CXX or install g++/clang++)")
        self.toolchain = tc
        self.blocks = blocks
        self.shuffle = shuffle
        self.seed = seed
        self.ftz = ftz
        self.cache = cache or KernelCache.from_env()
        self.flags = CXX_FLAGS + tuple(f for s in sorted(set(sanitize)) for f in SANITIZERS[s])
        self._launches = 0
        self._lock = threading.Lock()

    def load(self, src: CudaSource) -> _Module:
        text = emulation_source(src)
        header = _header()
        h = hashlib.sha256()
        for part in (
            text,
            header,
            self.toolchain.cxx,
            self.toolchain.version,
            " ".join(self.flags),
            KEY_SYMBOL,  # (libraries that carry their key: not those built before)
        ):
            h.update(part.encode())
            h.update(b"\0")
        key = h.hexdigest()
        body = text + key_definition(key, cxx=True)  # checked once loaded (libload)

        def build(out: Path) -> None:
            self._compile(body, header, out)

        lib = load_checked(self.cache, key, ".emu.so", build, lambda p: ctypes.CDLL(str(p)))[1]
        return _Module(lib, list(src.kernels))

    def _compile(self, text: str, header: str, out: Path) -> None:
        with tempfile.TemporaryDirectory(prefix="hipress-emu-") as d:
            hdr = Path(d) / "cuda_emu.h"
            hdr.write_text(header)
            cu = Path(d) / "kernels.cpp"
            cu.write_text(text)
            cmd = [self.toolchain.cxx, *self.flags, "-include", str(hdr), "-o", str(out), str(cu)]
            res = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if res.returncode != 0:
                raise CompileError(explain(res.stderr, text, cu.name))

    def prepare(self, module: _Module, device: torch.device) -> None:
        """Nothing to do: :meth:`load` compiled and loaded the library."""
        del module, device

    def launch(self, module: _Module, kernel: str, grid: int, block: int, args: bytes,
               fields: Sequence[Field], device: torch.device) -> None:  # fmt: skip
        del fields, device
        with self._lock:
            self._launches += 1
            seed = (self.seed * 0x9E3779B97F4A7C15 + self._launches) & (2**64 - 1)
        buf = ctypes.create_string_buffer(args, len(args))
        err = ctypes.create_string_buffer(512)
        rc = module.launch(module.entries[kernel], buf, grid, block, seed, int(self.shuffle),
                           int(self.ftz), err, len(err))  # fmt: skip
        if rc != 0:
            raise EmulationError(f"kernel {kernel}: {err.value.decode(errors='replace')}")

    def grid(self, n: int, device: torch.device) -> int:
        if self.blocks is not None:
            return self.blocks
        return max(1, min(GPU_BLOCKS, -(-n // NT)))

    def stream_key(self, device: torch.device) -> Hashable:
        return ("emulated", threading.get_ident())


def emulated_backend(program: Any, **kwargs: Any) -> Any:
    """A :class:`~hipress.compll.backends.cuda.backend.CudaBackend` on an :class:`EmulatedRuntime` (keyword
    arguments go to the runtime): ``Algorithm(program, emulated_backend(program))`` runs the
    CUDA kernels of ``program`` on CPU tensors."""
    from hipress.compll.backends.cuda.backend import CudaBackend

    return CudaBackend(program, EmulatedRuntime(**kwargs))


__all__ = ["CxxToolchain", "EmulatedRuntime", "EmulationError", "emulated_backend",
           "emulation_source"]  # fmt: skip
