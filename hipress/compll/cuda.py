"""The CUDA backend: generated CUDA C, compiled with NVRTC, launched through CuPy on GPU tensors.

- :func:`nvrtc_compile` compiles a source to PTX (or cubin) for a given architecture by calling
  NVRTC's C API through ctypes. It needs no GPU (CI uses it to compile-check every generated
  kernel for sm_80 and sm_90); errors come back as :class:`~hipress.compll.cache.CompileError`
  with the generated source, numbered.
- :class:`CudaBackend` runs a program on CUDA tensors: torch tensors are shared with CuPy through
  DLPack (no copies), kernels run on torch's current stream in the order of the schedule from
  :mod:`hipress.compll.render_cuda`; sort and top-k order their keys with CuPy's stable argsort.

Kernels are compiled with ``--fmad=false`` (no FMA contraction, like the reference) and IEEE
division / square root. Float sums are reduced per block, then over blocks in order (so results
are deterministic, but may differ from the reference in the last bit, as on the CPU).
"""

from __future__ import annotations

import ctypes
import glob
import os
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import torch

from hipress.compll import ir
from hipress.compll.algorithm import decode_sum_by_parts
from hipress.compll.cache import CompileError, explain
from hipress.compll.interp import eval_size
from hipress.compll.payload import layout
from hipress.compll.render_cuda import NB, NT, CudaSource, render_cuda_program
from hipress.compll.state import State

NVRTC_OPTIONS = ("--fmad=false", "--prec-div=true", "--prec-sqrt=true", "-std=c++17",
                 "-diag-suppress=177,550")  # fmt: skip
ARCHS = ("sm_80", "sm_90")


_NUMPY = {"f32": "float32", "f64": "float64", "i8": "int8", "i16": "int16", "i32": "int32",
          "i64": "int64", "u8": "uint8", "u16": "uint16", "u32": "uint32"}  # fmt: skip


class CudaUnavailable(Exception):
    """CUDA cannot run here (no CuPy, no GPU, no NVRTC)."""


# ---------------------------------------------------------------- NVRTC (no GPU needed)


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


# ---------------------------------------------------------------- running on a GPU


def _cupy() -> Any:
    try:
        import cupy as cp  # type: ignore[import-not-found]
    except ImportError as exc:
        raise CudaUnavailable(f"CuPy is not installed ({exc}); pip install cupy-cuda13x") from None
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            raise CudaUnavailable("no CUDA device")
    except cp.cuda.runtime.CUDARuntimeError as exc:
        raise CudaUnavailable(f"no usable CUDA device ({exc})") from None
    return cp


def _struct(fn: str, fields: list[tuple[str, Any]]) -> Any:
    """A numpy record with the C layout of hp_enc_args / hp_dec_args (natural alignment)."""
    import numpy as np

    names, formats, offsets = [], [], []
    off = 0
    for name, (fmt, val) in fields:
        size = np.dtype(fmt).itemsize
        off = (off + size - 1) // size * size
        names.append(name)
        formats.append(fmt)
        offsets.append(off)
        off += size
        del val
    dt = np.dtype({"names": names, "formats": formats, "offsets": offsets,
                   "itemsize": (off + 7) // 8 * 8})  # fmt: skip
    rec = np.zeros((), dtype=dt)
    for name, (_, val) in fields:
        rec[name] = val
    del fn
    return rec


class CudaBackend:
    """Runs a program's generated CUDA kernels on CUDA tensors (see module doc)."""

    name = "cuda"

    def __init__(self, program: ir.Program) -> None:
        cp = _cupy()
        self.cp = cp
        self.program = program
        self.src: CudaSource = render_cuda_program(program)
        self.module = cp.RawModule(code=self.src.source, options=NVRTC_OPTIONS)
        self._ws: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor, list[int]]] = {}
        self._sc: dict[str, torch.Tensor] = {}

    def _workspace(
        self, fn: str, n: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        key = (fn, n)
        if key not in self._ws:
            offs, off = [], 0
            for entry in self.src.layouts[fn]:
                assert entry is not None
                length, item = entry
                cnt = length if isinstance(length, int) else eval_size(length, n)  # type: ignore[arg-type]
                nbytes = (cnt * -item + 7) // 8 if item < 0 else cnt * item
                offs.append(off)
                off += (nbytes + 63) // 64 * 64
            ws = torch.empty(max(off, 64), dtype=torch.uint8, device=device)
            self._ws[key] = (ws, torch.tensor([*offs, 0], dtype=torch.int64, device=device), offs)
        return self._ws[key]

    def _slots(self, fn: str, device: torch.device) -> torch.Tensor:
        if fn not in self._sc:
            self._sc[fn] = torch.zeros(max(1, self.src.slots[fn]), dtype=torch.int64, device=device)
        return self._sc[fn]

    def _run(
        self, fn: str, args: Any, n: int, ws: torch.Tensor, offs: list[int], payload: torch.Tensor
    ) -> None:
        import numpy as np

        for step in self.src.schedules[fn]:
            if step.cupy is not None:
                self._cupy_step(step.cupy, n, ws, offs, payload)
                continue
            grid = 1 if step.grid == "one" else NB
            block = 1 if step.grid == "one" else NT
            self.module.get_function(step.kernel)((grid,), (block,), (args, np.int64(0)))

    def _bytes(self, spec: dict[str, Any], n: int, ws: torch.Tensor, offs: list[int],
               payload: torch.Tensor, nbytes: int) -> Any:  # fmt: skip
        """CuPy uint8 view (DLPack, no copy) of ``nbytes`` at a workspace entry or payload field."""
        if spec["kind"] == "ws":
            base = ws[offs[int(spec["index"])] :]
        else:
            fields, _ = layout(self.program, n)
            f = next(f for f in fields if f.name == spec["name"])
            base = payload[f.offset :]
        return self.cp.from_dlpack(base[:nbytes])

    def _cupy_step(
        self, step: dict[str, Any], n: int, ws: torch.Tensor, offs: list[int], payload: torch.Tensor
    ) -> None:
        cp = self.cp
        length = eval_size(step["length"], n)
        kb = 8 if step["kbits"] == 64 else 4
        keys = self._bytes({"kind": "ws", "index": step["keys"]}, n, ws, offs, payload, length * kb)
        keys = keys.view(cp.uint64 if kb == 8 else cp.uint32)
        order = cp.argsort(keys, kind="stable")  # topk keys are stored complemented: descending
        if step["kind"] == "topk":
            k = eval_size(step["k"], n)
            take = min(k, length)
            idx = self._bytes(step["out"], n, ws, offs, payload, 4 * k).view(cp.int32)
            idx[:take] = cp.sort(order[:take]).astype(cp.int32)
            idx[take:] = 0
        else:
            dt = cp.dtype(_NUMPY[str(step["dtype"])])
            vals = self._bytes({"kind": "ws", "index": step["vals"]}, n, ws, offs, payload,
                               length * dt.itemsize).view(dt)  # fmt: skip
            out = self._bytes(step["out"], n, ws, offs, payload, length * dt.itemsize).view(dt)
            cp.take(vals, order, out=out)

    def encode(self, grad: torch.Tensor, state: State, out: torch.Tensor) -> None:
        cp = self.cp
        n = state.n
        g = (
            grad
            if grad.dtype == torch.float32 and grad.is_contiguous()
            else grad.reshape(-1).float()
        )
        ws, wsoff, offs = self._workspace("hp_encode", n, grad.device)
        sc = self._slots("hp_encode", grad.device)
        ptrs = torch.tensor([state.tensors[s.name].data_ptr() for s in self.program.state] + [0],
                            dtype=torch.int64, device=grad.device)  # fmt: skip
        args = _struct("hp_encode", [
            ("n", ("i8", n)), ("grad", ("u8", g.data_ptr())), ("out", ("u8", out.data_ptr())),
            ("ws", ("u8", ws.data_ptr())), ("state", ("u8", ptrs.data_ptr())),
            ("seed", ("u8", state.seed & (2**64 - 1))), ("step", ("u8", state.step & (2**64 - 1))),
            ("tensor_id", ("u8", state.tensor_id & (2**64 - 1))), ("nthreads", ("i4", 0)),
            ("sc", ("u8", sc.data_ptr())), ("wsoff", ("u8", wsoff.data_ptr())),
        ])  # fmt: skip
        stream = cp.cuda.ExternalStream(torch.cuda.current_stream(grad.device).cuda_stream)
        with stream:
            self._run("hp_encode", args, n, ws, offs, out)

    def decode(self, payload: torch.Tensor, n: int, out: torch.Tensor, accumulate: bool) -> None:
        cp = self.cp
        direct = out.dtype == torch.float32 and out.is_contiguous()
        fn = "hp_decode_acc" if accumulate and direct else "hp_decode"
        ws, wsoff, offs = self._workspace(fn, n, payload.device)
        sc = self._slots(fn, payload.device)
        target = out if direct else torch.empty(n, dtype=torch.float32, device=payload.device)
        args = _struct(fn, [
            ("n", ("i8", n)), ("payload", ("u8", payload.data_ptr())),
            ("out", ("u8", target.data_ptr())), ("ws", ("u8", ws.data_ptr())),
            ("nthreads", ("i4", 0)), ("sc", ("u8", sc.data_ptr())),
            ("wsoff", ("u8", wsoff.data_ptr())),
        ])  # fmt: skip
        stream = cp.cuda.ExternalStream(torch.cuda.current_stream(payload.device).cuda_stream)
        with stream:
            self._run(fn, args, n, ws, offs, payload)
        if not direct:
            if accumulate:
                out.add_(target.to(out.dtype).view(out.shape))
            else:
                out.copy_(target.view(out.shape))

    def decode_sum(
        self, payloads: Sequence[torch.Tensor], n: int, out: torch.Tensor, divisor: float
    ) -> None:
        # (no fused kernel on this target yet: one pass over out per payload)
        decode_sum_by_parts(self, payloads, n, out, divisor)


def compile_check(program: ir.Program, archs: Sequence[str] = ARCHS) -> dict[str, int]:
    """Compile ``program``'s CUDA source for every arch with NVRTC (no GPU); PTX size per arch."""
    src = render_cuda_program(program).source
    return {a: len(nvrtc_compile(src, a, f"{program.name}.cu", cubin=True)) for a in archs}


__all__ = ["ARCHS", "CudaBackend", "CudaUnavailable", "compile_check", "nvrtc_compile"]
