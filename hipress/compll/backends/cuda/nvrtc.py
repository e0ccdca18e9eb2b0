"""NVRTC without a GPU: compile CUDA C to PTX or cubin (CI compile-checks every generated kernel
for sm_80 and sm_90 this way; CuPy compiles with NVRTC itself on a GPU)."""

from __future__ import annotations

import ctypes
import glob
import os
from collections.abc import Sequence
from functools import lru_cache

from hipress.compll.backends.cache import CompileError, explain
from hipress.compll.backends.cuda.runtime import NVRTC_OPTIONS, CudaUnavailable
from hipress.compll.ir import nodes as ir

ARCHS = ("sm_80", "sm_90")


@lru_cache(maxsize=1)
def _nvrtc() -> ctypes.CDLL:
    """The NVRTC library: from the ``nvidia-cuda-nvrtc`` wheel, $HIPRESS_NVRTC, or the system."""
    cands = [os.environ.get("HIPRESS_NVRTC", "")]
    try:
        import nvidia  # type: ignore[import-not-found]

        for base in nvidia.__path__:
            cands += sorted(glob.glob(os.path.join(base, "*", "lib", "libnvrtc.so*")))
    except ImportError:
        pass
    cands += ["libnvrtc.so", *sorted(glob.glob("/usr/local/cuda*/lib64/libnvrtc.so*"))]
    for c in cands:
        if not c or "builtins" in c or ".alt." in c:
            continue
        try:
            # NVRTC dlopens its builtins by soname: load them from the same directory first
            for b in sorted(glob.glob(os.path.join(os.path.dirname(c), "libnvrtc-builtins.so*"))):
                if ".alt." not in b:
                    ctypes.CDLL(b, mode=ctypes.RTLD_GLOBAL)
            return ctypes.CDLL(c)
        except OSError:
            continue
    raise CudaUnavailable("NVRTC not found: pip install 'nvidia-cuda-nvrtc==13.0.*'")


def nvrtc_compile(source: str, arch: str = "sm_80", name: str = "kernel.cu", cubin: bool = False,
                  options: Sequence[str] = NVRTC_OPTIONS) -> bytes:  # fmt: skip
    """Compile CUDA C ``source`` for ``arch`` (e.g. "sm_90"); return PTX (or cubin) bytes."""
    lib = _nvrtc()
    prog = ctypes.c_void_p()

    def check(rc: int, what: str) -> None:
        if rc != 0:
            lib.nvrtcGetErrorString.restype = ctypes.c_char_p
            raise CompileError(f"NVRTC {what} failed: {lib.nvrtcGetErrorString(rc).decode()}")

    check(
        lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None),
        "create",
    )
    try:
        target = arch if cubin else arch.replace("sm_", "compute_")
        opts = [f"--gpu-architecture={target}".encode(), *(o.encode() for o in options)]
        arr = (ctypes.c_char_p * len(opts))(*opts)
        rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
        if rc != 0:
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(prog, log)
            raise CompileError(explain(log.value.decode(errors="replace"), source, name))
        size = ctypes.c_size_t()
        getsize = lib.nvrtcGetCUBINSize if cubin else lib.nvrtcGetPTXSize
        get = lib.nvrtcGetCUBIN if cubin else lib.nvrtcGetPTX
        check(getsize(prog, ctypes.byref(size)), "size")
        buf = ctypes.create_string_buffer(size.value)
        check(get(prog, buf), "output")
        return buf.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def compile_check(program: ir.Program, archs: Sequence[str] = ARCHS) -> dict[str, int]:
    """Compile ``program``'s CUDA source for every arch with NVRTC (no GPU); cubin bytes per
    arch."""
    from hipress.compll.backends.targets import cuda_source

    src = cuda_source(program).source
    return {a: len(nvrtc_compile(src, a, f"{program.name}.cu", cubin=True)) for a in archs}


__all__ = ["ARCHS", "compile_check", "nvrtc_compile"]
