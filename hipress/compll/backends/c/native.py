"""The C backend: generated C kernels, compiled at first use, run on torch CPU tensors.

:class:`NativeBackend` renders the program (:func:`hipress.compll.backends.c.program.render_c`),
builds it through the :class:`~hipress.compll.backends.cache.KernelCache`, loads it with ctypes
and calls it on caller-provided buffers. Per element count it keeps one workspace (and, for
float16/bfloat16 or non-contiguous inputs, one float32 staging buffer), allocated at the first
call that needs it and reused; a sparse decode (topk, randomk, dgc, graddrop) needs none unless a payload repeats
an index, which no shipped encoder sends.
Calls are serialised by a lock (workspaces are shared), so several threads may use one backend;
the kernels themselves run on all cores with OpenMP.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from hipress.compll.backends.c.program import render_c
from hipress.compll.backends.cache import KernelCache, Toolchain, compile_c, kernel_key
from hipress.compll.backends.libload import key_definition, load_checked
from hipress.compll.backends.render import ABI_VERSION, generator_digest
from hipress.compll.ir import nodes as ir
from hipress.compll.ir.source import CllError
from hipress.compll.ir.state import State
from hipress.compll.ir.types import ArrayType, DType, torch_storage_dtype

log = logging.getLogger(__name__)

TARGET = "c"


class NativeError(CllError):
    """The C backend cannot run this call (wrong device, dtype or layout)."""

    kind = "backend error"


class _EncArgs(ctypes.Structure):
    _fields_ = [
        ("n", ctypes.c_int64),
        ("grad", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
        ("ws", ctypes.c_void_p),
        ("state", ctypes.POINTER(ctypes.c_void_p)),
        ("seed", ctypes.c_uint64),
        ("step", ctypes.c_uint64),
        ("tensor_id", ctypes.c_uint64),
        ("nthreads", ctypes.c_int32),
        ("nonfinite", ctypes.POINTER(ctypes.c_uint8)),
    ]


class _DecArgs(ctypes.Structure):
    _fields_ = [
        ("n", ctypes.c_int64),
        ("payload", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
        ("ws", ctypes.c_void_p),
        ("nthreads", ctypes.c_int32),
    ]


class _DecSumArgs(ctypes.Structure):
    _fields_ = [
        ("n", ctypes.c_int64),
        ("payloads", ctypes.POINTER(ctypes.c_void_p)),
        ("k", ctypes.c_int64),
        ("out", ctypes.c_void_p),
        ("divisor", ctypes.c_float),
        ("ws", ctypes.c_void_p),
        ("nthreads", ctypes.c_int32),
    ]


def _parts(
    prog: ir.Program, cache: KernelCache, toolchain: Toolchain
) -> tuple[str, str, Callable[[Path], None]]:
    """The cache key of ``prog``'s library, its source text and how to compile it (the
    source with the key's symbol appended: :mod:`hipress.compll.backends.libload`)."""
    key = kernel_key(prog.digest(), TARGET, toolchain.identity(), generator_digest(TARGET))
    source = cache.text(key, ".c", lambda: render_c(prog))

    def compile_lib(tmp: Path) -> None:
        log.info("compiling %s kernel %s", prog.name, key[:12])
        compile_c(source + key_definition(key), tmp, toolchain, prog.name)

    return key, source, compile_lib


def build(prog: ir.Program, cache: KernelCache, toolchain: Toolchain) -> tuple[Path, str]:
    """Compiled library of ``prog`` (from the cache, or built now) and its source text. The
    library's bytes have just been checked against its digest record (see
    :mod:`hipress.compll.backends.cache`); :class:`NativeBackend` also checks, once loaded,
    that it is the kernel of its key."""
    key, source, compile_lib = _parts(prog, cache, toolchain)
    return cache.get_or_build(key, ".so", compile_lib), source


def _open(path: Path) -> ctypes.CDLL:
    try:
        return ctypes.CDLL(str(path))
    except OSError as exc:  # e.g. a cache directory on a filesystem mounted noexec
        raise NativeError(
            f"cannot load the kernel library {path}: {exc}; set HIPRESS_CACHE_DIR to "
            "a directory on a filesystem that allows executable mappings"
        ) from None


class NativeBackend:
    """Runs a program with its generated C kernel (CPU tensors only)."""

    name = "cpu"

    def __init__(
        self,
        program: ir.Program,
        cache: KernelCache | None = None,
        toolchain: Toolchain | None = None,
    ) -> None:
        tc = toolchain or Toolchain.detect()
        if tc is None:
            raise NativeError("no C compiler found (set $CC or install gcc/clang)")
        self.program = program
        self._lock = threading.Lock()
        self.cache = cache or KernelCache.from_env()
        key, self.source, compile_lib = _parts(program, self.cache, tc)
        self.path, lib = load_checked(self.cache, key, ".so", compile_lib, _open)
        lib.hp_abi_version.restype = ctypes.c_int64
        if lib.hp_abi_version() != ABI_VERSION:  # pragma: no cover - stale file under our key
            raise NativeError(f"kernel library {self.path} has a different ABI; delete it")
        for fn in (
            "hp_encode_ws_bytes", "hp_decode_ws_bytes", "hp_decode_acc_ws_bytes",
            "hp_decode_sum_ws_bytes",
        ):  # fmt: skip
            getattr(lib, fn).restype = ctypes.c_int64
            getattr(lib, fn).argtypes = [ctypes.c_int64, ctypes.c_int32]
        lib.hp_encode.argtypes = [ctypes.POINTER(_EncArgs)]
        lib.hp_decode.argtypes = [ctypes.POINTER(_DecArgs)]
        lib.hp_decode_acc.argtypes = [ctypes.POINTER(_DecArgs)]
        lib.hp_decode_sum.argtypes = [ctypes.POINTER(_DecSumArgs)]
        lib.hp_decode_sparse.argtypes = [ctypes.POINTER(_DecSumArgs), ctypes.c_int32]
        lib.hp_decode_sparse.restype = ctypes.c_int
        self._lib = lib
        self._encode = lib.hp_encode
        self._decode = lib.hp_decode
        self._decode_acc = lib.hp_decode_acc
        self._decode_sum = lib.hp_decode_sum
        self._decode_sparse = lib.hp_decode_sparse
        self._sparse = True  # until hp_decode_sparse says the decode is not sparse
        self._ws: dict[tuple[str, int], torch.Tensor] = {}
        self._ws_need: dict[tuple[str, int, int], int] = {}
        self._state_types = [
            torch_storage_dtype(s.type if isinstance(s.type, DType) else s.type.dtype)
            for s in program.state
        ]

    def _buffer(self, kind: str, n: int, nbytes: int) -> torch.Tensor:
        buf = self._ws.get((kind, n))
        if buf is None or buf.numel() < nbytes:
            buf = torch.empty(max(nbytes, 8), dtype=torch.uint8)
            self._ws[(kind, n)] = buf
        return buf

    def _workspace(self, fn: str, n: int, nt: int) -> torch.Tensor:
        """The workspace for a call of ``fn`` (its ``_ws_bytes`` function) on ``n`` elements
        and ``nt`` threads: one buffer per element count, shared by encode and every decode
        (calls hold the lock), grown when a call needs more (a filter keeps one bound of
        indices per thread)."""
        key = (fn, n, nt)
        need = self._ws_need.get(key)
        if need is None:
            need = self._ws_need[key] = int(getattr(self._lib, fn)(n, nt))
        return self._buffer("ws", n, need)

    def workspace_bytes(self, n: int, nthreads: int | None = None) -> int:
        """Workspace bytes an encode or decode of ``n`` elements may use (on ``nthreads``
        threads, by default torch's): the largest, including a sparse decode's, which is only
        allocated for a payload that repeats an index (see :meth:`decode`)."""
        nt = torch.get_num_threads() if nthreads is None else nthreads
        lib = self._lib
        return max(
            lib.hp_encode_ws_bytes(n, nt), lib.hp_decode_ws_bytes(n, nt),
            lib.hp_decode_acc_ws_bytes(n, nt), lib.hp_decode_sum_ws_bytes(n, nt),
        )  # fmt: skip

    def encode(self, grad: torch.Tensor, state: State, out: torch.Tensor) -> bool | None:
        """Encode; returns whether ``grad`` holds NaN/Inf where the kernel's first pass finds
        out (hipress/compll/lower/finite.py), else None."""
        with self._lock:
            return self._encode_locked(grad, state, out)

    def decode(self, payload: torch.Tensor, n: int, out: torch.Tensor, accumulate: bool) -> None:
        with self._lock:
            self._decode_locked(payload, n, out, accumulate)

    def decode_sum(
        self, payloads: Sequence[torch.Tensor], n: int, out: torch.Tensor, divisor: float
    ) -> None:
        for p in payloads:
            _cpu(p, "payload")
            if not p.is_contiguous():
                raise NativeError("payload must be contiguous")
        _cpu(out, "output")
        if out.dtype != torch.float32 or not out.is_contiguous():
            raise NativeError("decode_sum needs a contiguous float32 output")
        ptrs = (ctypes.c_void_p * len(payloads))(*(p.data_ptr() for p in payloads))
        with self._lock:
            nt = torch.get_num_threads()
            args = _DecSumArgs(n, ptrs, len(payloads), out.data_ptr(), float(divisor), None, nt)
            if self._sparse_call(args, acc=False):
                return
            args.ws = self._workspace("hp_decode_sum_ws_bytes", n, nt).data_ptr()
            if self._decode_sum(ctypes.byref(args)) != 0:  # pragma: no cover - k >= 1 checked
                raise NativeError("decode_sum failed")

    def _sparse_call(self, args: _DecSumArgs, acc: bool) -> bool:
        """A sparse decode's sum (or decode-accumulate) without workspace; False if it must
        take the calls with workspace (not a sparse decode, or a payload repeats an index)."""
        if not self._sparse:
            return False
        rc = self._decode_sparse(ctypes.byref(args), int(acc))
        self._sparse = rc != 2
        return rc == 0

    def _encode_locked(self, grad: torch.Tensor, state: State, out: torch.Tensor) -> bool | None:
        n = state.n
        _cpu(grad, "gradient")
        _cpu(out, "payload buffer")
        if grad.dtype == torch.float32 and grad.is_contiguous():
            g = grad
        else:
            g = self._buffer("grad", n, 4 * n)[: 4 * n].view(torch.float32)
            g.copy_(grad.reshape(-1))
        ptrs = (ctypes.c_void_p * max(1, len(self.program.state)))()
        for k, (slot, dt) in enumerate(zip(self.program.state, self._state_types, strict=True)):
            t = state.tensors[slot.name]
            if t.device.type != "cpu" or t.dtype != dt or not t.is_contiguous():
                raise NativeError(
                    f"state `{slot.name}` must be a contiguous CPU {dt} tensor, got "
                    f"{t.device} {t.dtype}{'' if t.is_contiguous() else ' (non-contiguous)'}"
                )
            if isinstance(slot.type, ArrayType) and t.numel() == 0:
                ptrs[k] = None
            else:
                ptrs[k] = t.data_ptr()
        nt = torch.get_num_threads()
        ws = self._workspace("hp_encode_ws_bytes", n, nt)
        flag = ctypes.c_uint8(2)
        args = _EncArgs(
            n, g.data_ptr(), out.data_ptr(), ws.data_ptr(), ptrs,
            state.seed & (2**64 - 1), state.step & (2**64 - 1), state.tensor_id & (2**64 - 1), nt,
            ctypes.pointer(flag),
        )  # fmt: skip
        self._encode(ctypes.byref(args))
        return None if flag.value == 2 else bool(flag.value)

    def _decode_locked(
        self, payload: torch.Tensor, n: int, out: torch.Tensor, accumulate: bool
    ) -> None:
        _cpu(payload, "payload")
        _cpu(out, "output")
        if not payload.is_contiguous():
            raise NativeError("payload must be contiguous")
        direct = out.dtype == torch.float32 and out.is_contiguous()
        acc = accumulate and direct
        fn = self._decode_acc if acc else self._decode
        nt = torch.get_num_threads()
        if direct:
            target = out
        else:
            # the reference rounds the f32 result to out's dtype, then adds in that dtype
            target = self._buffer("dout", n, 4 * n)[: 4 * n].view(torch.float32)
        one = (ctypes.c_void_p * 1)(payload.data_ptr())
        if not self._sparse_call(_DecSumArgs(n, one, 1, target.data_ptr(), 1.0, None, nt), acc):
            ws = self._workspace(f"hp_{'decode_acc' if acc else 'decode'}_ws_bytes", n, nt)
            fn(ctypes.byref(_DecArgs(n, payload.data_ptr(), target.data_ptr(), ws.data_ptr(), nt)))
        if not direct:
            flat = out.view(-1) if out.is_contiguous() else out
            if accumulate:
                tmp = self._buffer(f"dcast-{out.dtype}", n, n * out.element_size())
                tmp = tmp[: n * out.element_size()].view(out.dtype)
                tmp.copy_(target)
                flat.add_(tmp.view(flat.shape))
            else:
                flat.copy_(target.view(flat.shape))


def _cpu(t: torch.Tensor, what: str) -> None:
    if t.device.type != "cpu":
        raise NativeError(f"the C backend runs on CPU tensors; the {what} is on {t.device}")
