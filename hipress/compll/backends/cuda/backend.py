"""The CUDA backend: generated CUDA C run by a :class:`~hipress.compll.backends.cuda.runtime.Runtime`.

:class:`CudaBackend` is everything between an :class:`~hipress.compll.algorithm.Algorithm` call
and the kernels, the same for every runtime: staging of inputs that are not contiguous float32,
per-stream workspaces (a block counter, the device scalar slots, then the program's arrays) from
a bounded pool, argument structs packed by value, the launch order of
:mod:`hipress.compll.backends.cuda.render`, and the host steps (sort and top-k as torch ops on the
device). On a GPU the runtime is :class:`~hipress.compll.backends.cuda.runtime.CupyRuntime` (CUDA
tensors); in CI it is :class:`~hipress.compll.backends.cuda.emu.EmulatedRuntime` (CPU tensors), so the
code here is tested on every run.

Nothing in a call waits for the device: no host synchronisation, no ``.item()``, no copy to the
device. An encode reports NaN/Inf in the gradient as a 0-d bool tensor on the device, where its
first pass finds out (:mod:`hipress.compll.lower.finite`), else None. Calls are enqueued under a lock
(two threads on one stream never interleave their kernels) and their buffers belong to the
caller's stream, so calls on different streams never share one.

:func:`nvrtc_compile` and :func:`compile_check` (NVRTC without a GPU) live in
:mod:`hipress.compll.backends.cuda.nvrtc` and are re-exported here.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hipress.compll.backends.base import decode_sum_by_parts
from hipress.compll.backends.cuda.abi import NT, STRUCTS, SUM_PAYLOADS, SYNC_BYTES, CudaSource
from hipress.compll.backends.cuda.nvrtc import ARCHS, compile_check, nvrtc_compile
from hipress.compll.backends.cuda.render import cuda_source
from hipress.compll.backends.cuda.runtime import (
    BufferPool,
    CudaUnavailable,
    CupyRuntime,
    Runtime,
    select_topk,
    stable_sort,
)
from hipress.compll.ir import nodes as ir
from hipress.compll.ir.interp import eval_size
from hipress.compll.ir.payload import layout
from hipress.compll.ir.source import CllError
from hipress.compll.ir.state import State
from hipress.compll.ir.types import ArrayType

_TORCH = {
    "f32": torch.float32,
    "f64": torch.float64,
    "i8": torch.int8,
    "i16": torch.int16,
    "i32": torch.int32,
    "i64": torch.int64,
    "u8": torch.uint8,
    "u16": torch.int16,
    "u32": torch.int32,
    "f16": torch.int16,
    "bf16": torch.int16,
    "f8e4m3": torch.uint8,
    "f8e5m2": torch.uint8,
    "bool": torch.uint8,
}
# (unsigned and half values are moved by a sort, never read: a type of the same width will do)


class CudaBackendError(CllError):
    """The CUDA backend cannot run this call (tensors on the wrong device)."""

    kind = "backend error"


# ---------------------------------------------------------------- the backend


@dataclass
class _Ws:
    """A call's workspace: the buffer (block counter, slots, arrays), the arrays' offsets in
    it, and the grid it was laid out for."""

    buf: torch.Tensor
    offs: list[int]
    grid: int

    @property
    def nbytes(self) -> int:
        return self.buf.numel()

    def ptrs(self) -> dict[str, int]:
        base = self.buf.data_ptr()
        return {"ws": base, "sync": base, "sc": base + SYNC_BYTES}


def _up64(x: int) -> int:
    return (x + 63) // 64 * 64


class CudaBackend:
    """Runs a program's generated CUDA kernels with ``runtime`` (default: CuPy on a GPU).

    ``max_buffers``: workspaces and staging buffers kept (least recently used dropped).
    ``sparse``: decode a sparse decode's payloads with the workspace-free kernels (else as any
    decode; both give the same values). ``src``: the rendered source to run instead of
    ``program``'s own (tools and tests: a modified kernel)."""

    name = "cuda"

    def __init__(self, program: ir.Program, runtime: Runtime | None = None,
                 max_buffers: int = 32, sparse: bool = True,
                 src: CudaSource | None = None) -> None:  # fmt: skip
        self.runtime = runtime if runtime is not None else CupyRuntime()
        self.program = program
        self.src = src if src is not None else cuda_source(program)
        self.module = self.runtime.load(self.src)
        self.sparse = sparse and self.src.sparse
        self.buffers: BufferPool = BufferPool(max_buffers)
        self._lock = threading.Lock()
        self._fields: dict[int, dict[str, int]] = {}
        self._sizes: dict[tuple[int, int], int] = {}

    def prepare(self, device: torch.device) -> None:
        """Compile and load the kernels for ``device`` now (a no-op where they are), so that
        the first call on it compiles nothing."""
        self.runtime.prepare(self.module, torch.device(device))

    # -- buffers, arguments, launches

    def _device(self, t: torch.Tensor, what: str) -> torch.device:
        if t.device.type != self.runtime.device_type:
            raise CudaBackendError(
                f"the {self.runtime.name} runtime of the CUDA backend runs on "
                f"{self.runtime.device_type} tensors; the {what} is on {t.device}"
            )
        return t.device

    def _workspace(self, fn: str, n: int, device: torch.device) -> _Ws:
        def make() -> _Ws:
            entry = self.src.entries[fn]
            grid = self.runtime.grid(n, device)
            offs, off = [], SYNC_BYTES + _up64(8 * max(1, entry.slots))
            for e in entry.workspace:
                if e.per_block:
                    count = e.per_block * grid
                else:
                    count = e.length if isinstance(e.length, int) else eval_size(e.length, n)  # type: ignore[arg-type]
                offs.append(off)
                off += _up64((count * -e.item + 7) // 8 if e.item < 0 else count * e.item)
            return _Ws(torch.zeros(max(off, 64), dtype=torch.uint8, device=device), offs, grid)

        return self.buffers.get((self.runtime.stream_key(device), fn, n), make)

    def _staging(self, what: str, n: int, device: torch.device) -> torch.Tensor:
        def make() -> _Ws:
            return _Ws(torch.empty(n, dtype=torch.float32, device=device), [], 0)

        return self.buffers.get((self.runtime.stream_key(device), what, n), make).buf

    def _pack(self, struct_name: str, values: dict[str, object]) -> bytes:
        out = []
        for f in self.src.structs[struct_name]:
            v = values.get(f.name, 0)
            vs = list(v) if isinstance(v, list | tuple) else [v]  # type: ignore[arg-type]
            vs += [0] * (f.size - len(vs))
            out.append(struct.pack(f"<{f.size}{f.code}", *vs))
        return b"".join(out)

    def _launch(self, kernel: str, struct_name: str, args: bytes, grid: int,
                device: torch.device) -> None:  # fmt: skip
        block = NT if grid > 0 else 1
        self.runtime.launch(self.module, kernel, max(grid, 1), block, args,
                            self.src.structs[struct_name], device)  # fmt: skip

    def _run(self, fn: str, values: dict[str, object], n: int, ws: _Ws, payload: torch.Tensor,
             device: torch.device) -> None:  # fmt: skip
        entry = self.src.entries[fn]
        args = self._pack(entry.struct, {**values, **ws.ptrs(), "wsoff": ws.offs})
        for ln in entry.launches:
            if ln.host is not None:
                self._host_step(ln.host, n, ws, payload)
            else:
                self._launch(ln.kernel, entry.struct, args, ws.grid if ln.grid == "grid" else 0,
                             device)  # fmt: skip

    def _field_offset(self, name: str, n: int) -> int:
        offs = self._fields.get(n)
        if offs is None:
            if len(self._fields) > 256:
                self._fields.clear()
            offs = self._fields[n] = {f.name: f.offset for f in layout(self.program, n)[0]}
        return offs[name]

    def _bytes(self, spec: dict[str, object], n: int, ws: _Ws, payload: torch.Tensor,
               nbytes: int) -> torch.Tensor:  # fmt: skip
        """A uint8 view of ``nbytes`` at a workspace array or a payload field."""
        if spec["kind"] == "ws":
            off = ws.offs[int(spec["index"])]  # type: ignore[call-overload]
            return ws.buf[off : off + nbytes]
        off = self._field_offset(str(spec["name"]), n)
        return payload[off : off + nbytes]

    def _size(self, e: object, n: int) -> int:
        """An IR length for ``n`` elements (remembered: no work on the host per call)."""
        key = (id(e), n)
        v = self._sizes.get(key)
        if v is None:
            if len(self._sizes) > 4096:
                self._sizes.clear()
            v = self._sizes[key] = eval_size(e, n)  # type: ignore[arg-type]
        return v

    def _host_step(self, step: dict[str, object], n: int, ws: _Ws, payload: torch.Tensor) -> None:
        length = self._size(step["length"], n)
        kbits = int(step["kbits"])  # type: ignore[call-overload]
        keys = self._bytes({"kind": "ws", "index": step["keys"]}, n, ws, payload,
                           length * kbits // 8)  # fmt: skip
        if step["kind"] == "topk":
            k = self._size(step["k"], n)
            out = self._bytes(step["out"], n, ws, payload, 4 * k).view(torch.int32)  # type: ignore[arg-type]
            select_topk(keys, kbits, length, k, out)
            return
        dt = _TORCH[str(step["dtype"])]
        size = torch.empty((), dtype=dt).element_size() * length
        vals = self._bytes({"kind": "ws", "index": step["vals"]}, n, ws, payload, size).view(dt)
        out = self._bytes(step["out"], n, ws, payload, size).view(dt)  # type: ignore[arg-type]
        stable_sort(keys, kbits, vals, out)

    # -- the Backend protocol

    def encode(self, grad: torch.Tensor, state: State, out: torch.Tensor) -> torch.Tensor | None:
        """Encode; returns a 0-d bool tensor on the device, true if ``grad`` holds NaN/Inf,
        where the encode's first pass finds out, else None."""
        device = self._device(grad, "gradient")
        self._device(out, "payload buffer")
        n = state.n
        with self._lock:
            g = grad
            if grad.dtype != torch.float32 or not grad.is_contiguous():
                g = self._staging("grad", n, device)
                g.view(grad.shape).copy_(grad)
            ws = self._workspace("hp_encode", n, device)
            entry = self.src.entries["hp_encode"]
            flag = torch.empty((), dtype=torch.bool, device=device) if entry.nonfinite else None
            ptrs = []
            for slot in self.program.state:
                t = state.tensors[slot.name]
                self._device(t, f"state `{slot.name}`")
                empty = isinstance(slot.type, ArrayType) and t.numel() == 0
                ptrs.append(0 if empty else t.data_ptr())
            values = {"n": n, "grad": g.data_ptr(), "out": out.data_ptr(),
                      "nonfinite": flag.data_ptr() if flag is not None else 0,
                      "seed": state.seed & (2**64 - 1), "step": state.step & (2**64 - 1),
                      "tensor_id": state.tensor_id & (2**64 - 1), "state": ptrs}  # fmt: skip
            self._run("hp_encode", values, n, ws, out, device)
        return flag

    def decode(self, payload: torch.Tensor, n: int, out: torch.Tensor, accumulate: bool) -> None:
        device = self._device(payload, "payload")
        self._device(out, "output")
        direct = out.dtype == torch.float32 and out.is_contiguous()
        acc = accumulate and direct
        with self._lock:
            # the reference rounds the f32 result to out's dtype, then adds in that dtype
            target = out.view(-1) if direct else self._staging("dout", n, device)
            if self.sparse:
                self._sparse_run([payload], n, target, 1 if acc else 0, 1.0)
            else:
                fn = "hp_decode_acc" if acc else "hp_decode"
                ws = self._workspace(fn, n, device)
                values = {"n": n, "payload": payload.data_ptr(), "out": target.data_ptr()}
                self._run(fn, values, n, ws, payload, device)
            if not direct:
                if accumulate:
                    out.add_(target.to(out.dtype).view(out.shape))
                else:
                    out.copy_(target.view(out.shape))

    def decode_sum(
        self, payloads: Sequence[torch.Tensor], n: int, out: torch.Tensor, divisor: float
    ) -> None:
        device = self._device(out, "output")
        for p in payloads:
            self._device(p, "payload")
        if out.dtype != torch.float32 or not out.is_contiguous():
            raise CudaBackendError("decode_sum needs a contiguous float32 output")
        if self.src.decode_sum:
            with self._lock:
                grid = self.runtime.grid(n, device)
                chunks = [payloads[k : k + SUM_PAYLOADS]
                          for k in range(0, len(payloads), SUM_PAYLOADS)]  # fmt: skip
                for c, chunk in enumerate(chunks):
                    args = self._pack(STRUCTS["dsum"], {
                        "n": n, "out": out.data_ptr(), "k": len(chunk), "cont": int(c > 0),
                        "divisor": float(divisor),
                        "pays": [p.data_ptr() for p in chunk],
                    })  # fmt: skip
                    self._launch("hp_decode_sum", STRUCTS["dsum"], args, grid, device)
        elif self.sparse:
            with self._lock:
                self._sparse_run(payloads, n, out, 2, float(divisor))
        else:
            decode_sum_by_parts(self, payloads, n, out, divisor)

    def _sparse_run(self, payloads: Sequence[torch.Tensor], n: int, out: torch.Tensor,
                    mode: int, divisor: float) -> None:  # fmt: skip
        """The hp_sparse_* kernels (cuda.render_sum): mode 0 decode, 1 decode-accumulate, 2 sum."""
        device = out.device

        def make() -> _Ws:
            grid = self.runtime.grid(n, device)
            size = SYNC_BYTES + 64 + 16 * grid
            return _Ws(torch.zeros(size, dtype=torch.uint8, device=device), [], grid)

        ws = self.buffers.get((self.runtime.stream_key(device), "sparse", n), make)
        base = ws.buf.data_ptr()
        name = STRUCTS["sparse"]
        args = b""
        for r, p in enumerate(payloads):
            args = self._pack(name, {"n": n, "out": out.data_ptr(), "payload": p.data_ptr(),
                                     "ws": base + SYNC_BYTES + 64, "sc": base + SYNC_BYTES,
                                     "sync": base, "r": r, "mode": mode, "divisor": divisor})  # fmt: skip
            self._launch("hp_sparse_check", name, args, ws.grid, device)
            self._launch("hp_sparse_scatter", name, args, ws.grid, device)
        self._launch("hp_sparse_finish", name, args, ws.grid, device)


__all__ = ["ARCHS", "CudaBackend", "CudaBackendError", "CudaUnavailable", "compile_check",
           "nvrtc_compile"]  # fmt: skip
