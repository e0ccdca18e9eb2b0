"""Loading algorithms and running them: :class:`Algorithm`, :func:`load`, :func:`load_file`.

An :class:`Algorithm` is one ``.cll`` program specialised to concrete hyper-parameters, bound to a
backend that executes it. Every backend computes what the reference interpreter computes.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from hipress.compll.backends.base import Backend
from hipress.compll.backends.select import resolve_backend
from hipress.compll.frontend import ast
from hipress.compll.frontend.check import elaborate
from hipress.compll.frontend.parse import parse
from hipress.compll.ir import interp
from hipress.compll.ir import nodes as ir
from hipress.compll.ir.calls import (
    StateSpec,
    check_count,
    check_encode,
    check_output,
    check_payload,
    check_payloads,
    state_spec,
)
from hipress.compll.ir.payload import layout
from hipress.compll.ir.source import CllError, SourceFile
from hipress.compll.ir.state import State
from hipress.compll.ir.types import ArrayType, torch_storage_dtype
from hipress.compll.lower.lower import reports_nonfinite

log = logging.getLogger(__name__)

# names of the state array that carries error feedback (Algorithm.error_feedback)
EF_STATES = ("residual", "comp")


class Algorithm:
    """A compression algorithm ready to run.

    Attributes:
        name: the algorithm's name (from its ``algorithm`` declaration).
        doc: its one-line description.
        params: every hyper-parameter with its value (defaults filled in).
        program: the specialised IR.
        digest: content hash of the IR (equal on every rank that loaded the same algorithm).
        backend: the executing backend.
    """

    def __init__(self, program: ir.Program, backend: Backend, path: str = "") -> None:
        self.program = program
        self.backend = backend
        self.path = path
        self.name = program.name
        self.doc = program.doc
        self.params: dict[str, Any] = dict(program.params)
        self.digest = program.digest()[:16]
        self._sizes: dict[int, int] = {}
        self._specs: dict[int, StateSpec] = {}
        self._reports: bool | None = None

    def __repr__(self) -> str:
        ps = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"Algorithm({self.name}({ps}), backend={self.backend.name})"

    @property
    def stateful(self) -> bool:
        return bool(self.program.state)

    @property
    def error_feedback(self) -> bool:
        """Whether the algorithm keeps error feedback: by convention a state array named
        ``residual`` (the error itself) or ``comp`` (the last compensated gradient, whose
        residual is ``comp`` minus its decode; docs/reference/compll-language.md)."""
        return any(s.name in EF_STATES for s in self.program.state)

    @property
    def uses_random(self) -> bool:
        return self.program.uses_random

    def payload_nbytes(self, n: int) -> int:
        """Bytes of the payload for ``n`` elements: a static function of n, a multiple of 8."""
        if n not in self._sizes:
            check_count(f"{self.name}.payload_nbytes", n)
            self._sizes[n] = layout(self.program, n)[1]
        return self._sizes[n]

    def bits_per_element(self, n: int = 1 << 20) -> float:
        return self.payload_nbytes(n) * 8 / max(1, n)

    def init_state(
        self, n: int, device: torch.device | str | None = None, seed: int = 0, tensor_id: int = 0
    ) -> State:
        """Zero-initialised declared state for a tensor of ``n`` elements."""
        check_count(f"{self.name}.init_state", n)
        tensors = {}
        for slot in self.program.state:
            if isinstance(slot.type, ArrayType):
                length = interp.eval_size(slot.type.length, n)
                dt = torch_storage_dtype(slot.type.dtype)
                tensors[slot.name] = torch.zeros(length, dtype=dt, device=device)
            else:
                tensors[slot.name] = torch.zeros(
                    (), dtype=torch_storage_dtype(slot.type), device=device
                )
        return State(n=n, tensors=tensors, step=0, seed=seed, tensor_id=tensor_id)

    def build_kernels(self, device: torch.device | str = "cpu") -> Algorithm:
        """Build the kernels that run tensors on ``device`` now (generate, compile or find
        them in the kernel cache, load them): what the first encode or decode there would
        otherwise do, inside a training step. A no-op where they are ready or the backend
        compiles nothing. Returns ``self``. Raises
        :class:`~hipress.compll.backends.base.BackendError` where the kernels cannot run on
        ``device`` (e.g. no CuPy for a CUDA device)."""
        prep = getattr(self.backend, "prepare", None)
        if prep is not None:
            prep(torch.device(device))
        return self

    def encode(
        self, grad: torch.Tensor, state: State, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Compress ``grad`` (any shape, float32/16/bf16) into a uint8 payload.

        Updates ``state`` (error feedback etc.) and advances ``state.step``. ``out``, if given,
        must be a contiguous uint8 tensor of :meth:`payload_nbytes` bytes and is returned.
        """
        return self.encode_checked(grad, state, out)[0]

    def encode_checked(
        self, grad: torch.Tensor, state: State, out: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, bool | torch.Tensor | None]:
        """:meth:`encode`, and whether ``grad`` holds NaN/Inf, where the algorithm finds out in
        the same pass on every backend (most algorithms: hipress/compll/lower/finite.py): a
        bool, or on the CUDA backend a 0-d bool tensor on the device (reading it waits for the
        encode); None where it does not, on every backend alike (check it yourself then).

        Raises :class:`~hipress.compll.ir.calls.CallError` for a state, gradient or buffer the
        kernels cannot use (wrong size, dtype, device, layout), before anything runs."""
        nbytes = self.payload_nbytes(state.n) if isinstance(state, State) else 0
        check_encode(self.name, self._state_spec(state), grad, state, out, nbytes)
        flat = grad.reshape(-1)
        if out is None:
            out = torch.empty(nbytes, dtype=torch.uint8, device=grad.device)
        bad = self.backend.encode(flat, state, out)
        state.step += 1
        return out, bad if self.reports_nonfinite else None

    @property
    def reports_nonfinite(self) -> bool:
        """Whether :meth:`encode_checked` finds out if the gradient holds NaN/Inf (the same
        answer on every backend)."""
        if self._reports is None:
            self._reports = reports_nonfinite(self.program)
        return self._reports

    def _state_spec(self, state: State) -> StateSpec:
        if not isinstance(state, State):
            return {}
        spec = self._specs.get(state.n)
        if spec is None:
            if len(self._specs) > 1024:
                self._specs.clear()
            spec = self._specs[state.n] = state_spec(self.program, state.n)
        return spec

    def decode(
        self,
        payload: torch.Tensor,
        n: int,
        out: torch.Tensor | None = None,
        accumulate: bool = False,
    ) -> torch.Tensor:
        """Decompress ``payload`` into ``n`` floats (``out += ...`` when ``accumulate``)."""
        check_payload(self.name, "decode", payload, self.payload_nbytes(n), n)
        if out is None:
            if accumulate:
                raise ValueError("accumulate=True needs an out tensor")
            out = torch.empty(n, dtype=torch.float32, device=payload.device)
        else:
            check_output(self.name, "decode", out, n, payload.device)
        self.backend.decode(payload, n, out.view(-1), accumulate)
        return out

    def decode_sum(
        self,
        payloads: Sequence[torch.Tensor],
        n: int,
        out: torch.Tensor | None = None,
        divide_by: float = 1,
    ) -> torch.Tensor:
        """The sum of several payloads' decodes of ``n`` floats, each divided by
        ``divide_by``: ``decode(p[0]) / divide_by + decode(p[1]) / divide_by + ...``, in
        float32, in that order (:func:`decode_sum_by_parts`), rounded once to ``out``'s dtype.
        Each decode is divided before the sum, as DDP divides each gradient: N workers'
        values near the float32 maximum average to a finite value.

        Averaging N workers' payloads this way writes ``out`` once: where the backend can
        (a decode that is one map over its output, C backend), each tile of ``out`` stays in
        cache while every payload adds to it. A contiguous float32 ``out`` needs no temporary.
        """
        device = check_payloads(self.name, "decode_sum", payloads, self.payload_nbytes(n), n)
        if (
            not isinstance(divide_by, int | float)
            or isinstance(divide_by, bool)
            or not (divide_by != 0 and math.isfinite(divide_by))
        ):
            raise ValueError(f"{self.name}.decode_sum: divide_by must be finite and non-zero")
        if out is None:
            out = torch.empty(n, dtype=torch.float32, device=device)
        else:
            check_output(self.name, "decode_sum", out, n, device)
        direct = out.dtype == torch.float32 and out.is_contiguous()
        target = out.view(-1) if direct else torch.empty(n, dtype=torch.float32, device=device)
        self.backend.decode_sum(payloads, n, target, divide_by)
        if not direct:
            out.copy_(target.view(out.shape))
        return out


# ---------------------------------------------------------------- loading


def _resolve_backend(name: str, program: ir.Program) -> Backend:
    return resolve_backend(name, program)


@lru_cache(maxsize=128)
def _parsed(path: str, text: str) -> ast.Module:
    return parse(SourceFile(path, text))


def load_source(source: SourceFile, backend: str = "auto", **params: Any) -> Algorithm:
    """Check ``source`` with ``params`` and bind it to ``backend``."""
    module = _parsed(source.path, source.text)
    program = elaborate(source, module, params)
    return Algorithm(program, _resolve_backend(backend, program), source.path)


def load_file(path: str | Path, backend: str = "auto", **params: Any) -> Algorithm:
    """Load a ``.cll`` file; raises :class:`CllError` with ``path:line:col`` on any problem."""
    return load_source(SourceFile.read(path), backend=backend, **params)


def shipped_path(name: str) -> Path:
    """Path of a shipped algorithm's ``.cll`` file."""
    root = resources.files("hipress.algorithms")
    p = root.joinpath(f"{name}.cll")
    if not p.is_file():
        raise CllError(f"unknown algorithm {name!r}; shipped: {', '.join(algorithms())}")
    return Path(str(p))


def build_all_kernels(algs: Sequence[Algorithm], device: torch.device | str = "cpu",
                max_workers: int | None = None) -> None:  # fmt: skip
    """:meth:`Algorithm.build_kernels` for every algorithm in ``algs``, on up to ``max_workers``
    threads (default: one per algorithm, at most 8): compilers run as other processes (C) or
    without Python's lock (NVRTC), so distinct algorithms compile in parallel. Raises the first
    algorithm's error, after every compile has ended."""
    from concurrent.futures import ThreadPoolExecutor

    algs = list(algs)
    if len(algs) <= 1 or max_workers == 1:
        for a in algs:
            a.build_kernels(device)
        return
    with ThreadPoolExecutor(max_workers or min(8, len(algs))) as pool:
        futures = [pool.submit(a.build_kernels, device) for a in algs]
    for f in futures:
        f.result()


def algorithms() -> list[str]:
    """Names of the shipped (single-round) algorithms; the multi-round ones load with
    :func:`hipress.compll.rounds.load_rounds`."""
    return [n for n, rounds in _shipped() if not rounds]


def _shipped() -> list[tuple[str, bool]]:
    """Every shipped ``.cll`` file's name and whether it is a multi-round algorithm."""
    from hipress.compll.frontend.rounds import is_rounds

    root = resources.files("hipress.algorithms")
    out = []
    for p in sorted(root.iterdir(), key=lambda p: p.name):
        if p.name.endswith(".cll"):
            out.append((p.name[:-4], is_rounds(_parsed(str(p), p.read_text()))))
    return out


def load(name: str, backend: str = "auto", **params: Any) -> Algorithm:
    """Load a shipped algorithm by name, e.g. ``load("terngrad", bitwidth=4)``."""
    return load_file(shipped_path(name), backend=backend, **params)
