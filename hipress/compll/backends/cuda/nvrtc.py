"""NVRTC, called directly: CUDA C to PTX or cubin, with exactly hipress's options.

What a GPU runs is compiled here, not by CuPy: CuPy's ``RawModule`` appends ``-ftz=true`` after
the caller's options, and NVRTC takes the last, so every float32 instruction would flush
denormals and the kernels would no longer compute what the reference interpreter (and the C
backend, and the CPU emulation of these kernels) computes. :data:`NVRTC_OPTIONS` keep IEEE
float32: no flush-to-zero, correctly rounded division and square root, no contraction into
fused multiply-adds (the C backend's ``-ffp-contract=off``). :func:`semantic_flags` lists the PTX
instructions that would break that, and CI checks every shipped algorithm with it.

:func:`device_image` compiles for one GPU architecture (a cubin where this NVRTC knows the
architecture, else PTX for the newest one it knows below it, which the driver compiles when the
module loads) through the kernel cache, so a process that finds the image on disk compiles
nothing. Compiling needs no GPU: CI compile-checks every generated kernel for sm_80 and sm_90.
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import os
import re
from collections.abc import Sequence
from functools import lru_cache

from hipress.compll.backends.cache import CompileError, KernelCache
from hipress.compll.backends.text import explain
from hipress.compll.ir import nodes as ir

ARCHS = ("sm_80", "sm_90")
NVRTC_OPTIONS = ("--ftz=false", "--prec-div=true", "--prec-sqrt=true", "--fmad=false",
                 "-std=c++17", "-diag-suppress=177,550")  # fmt: skip
# PTX instruction modifiers whose results differ from IEEE float32 as the C target computes it
_SEMANTIC = re.compile(r"^\s*(?:@!?%p\d+\s+)?([a-z0-9_]+(?:\.[a-z0-9_]+)*\.(?:ftz|approx)\b[.\w]*)",
                       re.MULTILINE)  # fmt: skip


class CudaUnavailable(Exception):
    """CUDA cannot run here (no CuPy, no GPU, no NVRTC); the message says why and what to do."""


@lru_cache(maxsize=1)
def _nvrtc() -> ctypes.CDLL:
    """The NVRTC library: $HIPRESS_NVRTC, the ``nvidia-cuda-nvrtc`` wheel, or the system's."""
    cands = [os.environ.get("HIPRESS_NVRTC", "")]
    try:
        import nvidia  # type: ignore[import-not-found]

        for base in nvidia.__path__:
            cands += sorted(glob.glob(os.path.join(base, "*", "lib", "libnvrtc.so*")))
    except ImportError:
        pass
    cands += ["libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12",
              *sorted(glob.glob("/usr/local/cuda*/lib64/libnvrtc.so*"))]  # fmt: skip
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


@lru_cache(maxsize=1)
def version() -> tuple[int, int]:
    """NVRTC's (major, minor) version."""
    major, minor = ctypes.c_int(), ctypes.c_int()
    _nvrtc().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value


@lru_cache(maxsize=1)
def supported_archs() -> tuple[int, ...]:
    """The GPU architectures this NVRTC compiles for, as compute capabilities (90 = sm_90)."""
    lib = _nvrtc()
    count = ctypes.c_int()
    if lib.nvrtcGetNumSupportedArchs(ctypes.byref(count)) != 0:
        return ()
    arr = (ctypes.c_int * count.value)()
    lib.nvrtcGetSupportedArchs(arr)
    return tuple(sorted(arr))


def target_for(capability: tuple[int, int]) -> tuple[str, bool]:
    """What to compile for a GPU of compute ``capability``: ``(arch, cubin)``. A cubin for
    ``sm_XY`` where this NVRTC supports it; else PTX for the newest architecture it supports
    below the GPU's (the driver compiles PTX for the GPU when the module loads). Raises
    :class:`CudaUnavailable` if the GPU is older than every supported architecture."""
    cc = capability[0] * 10 + capability[1]
    archs = supported_archs()
    if not archs or cc in archs:
        return f"sm_{cc}", True
    below = [a for a in archs if a < cc]
    if not below:
        raise CudaUnavailable(
            f"NVRTC {'.'.join(map(str, version()))} compiles for compute capability "
            f"{archs[0] / 10:.1f} and newer; this GPU is {capability[0]}.{capability[1]}: "
            "install the NVRTC of an older CUDA (pip install 'hipress[cuda12]')"
        )
    return f"sm_{below[-1]}", False


def nvrtc_compile(source: str, arch: str = "sm_80", name: str = "kernel.cu", cubin: bool = False,
                  options: Sequence[str] = NVRTC_OPTIONS) -> bytes:  # fmt: skip
    """Compile CUDA C ``source`` for ``arch`` (e.g. "sm_90"); return PTX (or cubin) bytes.
    Raises :class:`~hipress.compll.backends.cache.CompileError` with the numbered source."""
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


def semantic_flags(ptx: str | bytes) -> list[str]:
    """The instructions in ``ptx`` that change float32 results (flush-to-zero ``.ftz``,
    approximate ``.approx``), one entry per kind, in order of first use."""
    text = ptx.decode(errors="replace") if isinstance(ptx, bytes) else ptx
    return list(dict.fromkeys(m.group(1) for m in _SEMANTIC.finditer(text)))


def device_image(source: str, capability: tuple[int, int], name: str = "kernel.cu",
                 cache: KernelCache | None = None) -> bytes:  # fmt: skip
    """The module image (cubin, or PTX: :func:`target_for`) of ``source`` for a GPU of compute
    ``capability``, compiled with :data:`NVRTC_OPTIONS`, from ``cache`` (default: the user's
    kernel cache) where it is there. The key covers the source, the options, the target and
    NVRTC's version."""
    arch, cubin = target_for(capability)
    h = hashlib.sha256()
    tool = "nvrtc {}.{}".format(*version())
    for part in (source, " ".join(NVRTC_OPTIONS), arch, str(cubin), tool):
        h.update(part.encode())
        h.update(b"\0")
    cache = cache or KernelCache.from_env()
    return cache.data(h.hexdigest(), ".cubin" if cubin else ".ptx",
                      lambda: nvrtc_compile(source, arch, name, cubin=cubin))  # fmt: skip


def compile_check(program: ir.Program, archs: Sequence[str] = ARCHS) -> dict[str, int]:
    """Compile ``program``'s CUDA source for every arch with NVRTC (no GPU); cubin bytes per
    arch."""
    from hipress.compll.backends.cuda.render import cuda_source

    src = cuda_source(program).source
    return {a: len(nvrtc_compile(src, a, f"{program.name}.cu", cubin=True)) for a in archs}


__all__ = ["ARCHS", "NVRTC_OPTIONS", "CudaUnavailable", "compile_check", "device_image",
           "nvrtc_compile", "semantic_flags", "supported_archs", "target_for", "version"]  # fmt: skip
