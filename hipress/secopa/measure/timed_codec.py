"""What the profiler measures: an encode/decode pair on pre-allocated buffers.

A :class:`TimedCodec` names an algorithm, gives its payload size, and for a size n prepares
zero-argument closures (``encode``, ``decode`` and, if it can, ``decode_acc``: decode adding
into the output, and ``decode_sum2``: the average of two payloads, as CaSync averages) that
work on buffers allocated once, so the profiler times the kernels and not the allocator (fresh
large tensors cost page faults here).

Three adapters:

- :class:`TimedAlgorithm` wraps a CompLL algorithm (``hipress.compll.load(...)``).
- :class:`TimedCallables` wraps plain ``encode(x) -> payload`` / ``decode(payload, n) -> x``
  callables.
- :func:`timed_cast` is a dtype cast (``fp16``/``bf16``), the baseline users compare with.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

Thunk = Callable[[], object]


class TimedCodecError(ValueError):
    """An algorithm or codec cannot be profiled (unknown name, missing method)."""


@runtime_checkable
class TimedCodec(Protocol):
    """An encode/decode pair the profiler can time (see the module docstring)."""

    name: str
    params: Mapping[str, Any]

    def payload_nbytes(self, n: int) -> int: ...

    def prepare(self, n: int) -> Mapping[str, Thunk]:
        """Allocate buffers for n elements; return closures over them: ``encode``,
        ``decode`` and optionally ``decode_acc`` and ``decode_sum2``."""
        ...


def _gradient(n: int, seed: int = 0, device: torch.device | None = None) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=gen, dtype=torch.float32).to(device or "cpu")


@dataclass(frozen=True)
class TimedAlgorithm:
    """A CompLL algorithm object (``encode(g, state, out)``, ``decode(p, n, out)``), run on
    tensors on ``device`` (default CPU; a GPU for a model trained there: its CUDA kernels)."""

    alg: Any
    device: torch.device | None = None

    @property
    def name(self) -> str:
        return str(self.alg.name)

    @property
    def params(self) -> Mapping[str, Any]:
        return dict(self.alg.params)

    def payload_nbytes(self, n: int) -> int:
        return int(self.alg.payload_nbytes(n))

    def checks_finite(self) -> bool:
        """Whether the encode reports NaN/Inf in its gradient from its own pass
        (``encode_checked``), so CaSync needs no read of the chunk for it."""
        fn = getattr(self.alg, "encode_checked", None)
        if fn is None:
            return False
        g = _gradient(256, device=self.device)
        return fn(g, self.alg.init_state(256, device=self.device))[1] is not None

    def prepare(self, n: int) -> Mapping[str, Thunk]:
        dev = self.device
        g = _gradient(n, device=dev)
        st = self.alg.init_state(n, device=dev, seed=0, tensor_id=0)
        payload = torch.empty(self.payload_nbytes(n), dtype=torch.uint8, device=dev)
        out = torch.empty(n, dtype=torch.float32, device=dev)
        self.alg.encode(g, st, out=payload)

        def encode() -> object:
            return self.alg.encode(g, st, out=payload)

        def decode() -> object:
            return self.alg.decode(payload, n, out=out)

        def decode_acc() -> object:
            return self.alg.decode(payload, n, out=out, accumulate=True)

        thunks = {"encode": encode, "decode": decode, "decode_acc": decode_acc}
        if hasattr(self.alg, "decode_sum"):  # how CaSync averages: two payloads, one divide
            pair = [payload, payload]
            thunks["decode_sum2"] = lambda: self.alg.decode_sum(pair, n, out=out, divide_by=2)
        return thunks


@dataclass(frozen=True)
class TimedCallables:
    """Plain callables: ``encode(x) -> uint8 payload``, ``decode(payload, n) -> float32``.

    Allocation inside the callables is timed too (that is their cost).
    """

    name: str
    encode: Callable[[torch.Tensor], torch.Tensor]
    decode: Callable[[torch.Tensor, int], torch.Tensor]
    nbytes: Callable[[int], int]
    params: Mapping[str, Any] = field(default_factory=dict)

    def payload_nbytes(self, n: int) -> int:
        return int(self.nbytes(n))

    def prepare(self, n: int) -> Mapping[str, Thunk]:
        g = _gradient(n)
        payload = self.encode(g)

        def enc() -> object:
            return self.encode(g)

        def dec() -> object:
            return self.decode(payload, n)

        return {"encode": enc, "decode": dec}


@dataclass(frozen=True)
class _TimedCast:
    name: str
    dtype: torch.dtype
    params: Mapping[str, Any] = field(default_factory=dict)

    def payload_nbytes(self, n: int) -> int:
        nbytes = n * torch.finfo(self.dtype).bits // 8
        return -(-nbytes // 8) * 8

    def prepare(self, n: int) -> Mapping[str, Thunk]:
        g = _gradient(n)
        low = torch.empty(n, dtype=self.dtype)
        out = torch.empty(n, dtype=torch.float32)
        low.copy_(g)
        return {
            "encode": lambda: low.copy_(g),
            "decode": lambda: out.copy_(low),
            "decode_acc": lambda: out.add_(low),
        }


def timed_cast(name: str) -> TimedCodec:
    """``fp16`` or ``bf16``: a cast into a pre-allocated buffer and back."""
    dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16}
    if name not in dtypes:
        raise TimedCodecError(f"unknown cast codec {name!r} (fp16, bf16)")
    return _TimedCast(name, dtypes[name])


def as_timed_codec(obj: object, device: torch.device | str | None = None) -> TimedCodec:
    """Return ``obj`` as a :class:`TimedCodec`: a codec as is, a CompLL algorithm wrapped (run on
    ``device``)."""
    if isinstance(obj, TimedCodec):
        return obj
    needed = ("name", "params", "payload_nbytes", "init_state", "encode", "decode")
    if all(hasattr(obj, a) for a in needed):
        return TimedAlgorithm(obj, torch.device(device) if device is not None else None)
    raise TimedCodecError(
        f"{type(obj).__name__} is neither a TimedCodec nor a CompLL algorithm (needs {needed})"
    )


def load_timed_codec(
    name: str, params: Mapping[str, Any] | None = None, backend: str = "auto"
) -> TimedCodec:
    """A CompLL algorithm by name (``hipress.compll.load``), as a codec.

    Without CompLL, ``fp16``/``bf16`` fall back to plain casts. Raises :class:`TimedCodecError`
    if the name or parameters are unknown.
    """
    params = dict(params or {})
    try:
        from hipress.compll import BackendError, CllError, load
    except ImportError as exc:
        if name in ("fp16", "bf16") and not params:
            return timed_cast(name)
        raise TimedCodecError(
            f"cannot load algorithm {name!r}: hipress.compll is unavailable ({exc}); "
            "use a saved --profile"
        ) from None
    try:
        return TimedAlgorithm(load(name, backend=backend, **params))
    except (CllError, BackendError, KeyError, ValueError, TypeError, OSError) as exc:
        raise TimedCodecError(f"cannot load algorithm {name!r} with {params}: {exc}") from None
