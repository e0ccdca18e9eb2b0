"""The compression-algorithm helpers every sync relies on (the DDP hook, FSDP, Horovod), and the
per-chunk states.

They need only the :class:`~hipress.core.compression.CompressionAlgorithm` surface; an object that
also has CompLL's ``decode_sum`` averages N payloads in one pass over the output
(:func:`decode_mean`). "No compression" is :class:`~hipress.core.compression.Uncompressed`.

State keys (:func:`~hipress.core.layout.chunk_key`, on each
:class:`~hipress.core.layout.ChunkLayout`) and RNG streams are derived in one place, so the
runtimes (:mod:`hipress.casync.state`, :mod:`hipress.fsdp.collective`, :mod:`hipress.horovod.sync`)
and the single-process references (:mod:`hipress.casync.reference`, :mod:`hipress.fsdp.reference`)
draw exactly the same random numbers.
"""

from __future__ import annotations

import functools
import hashlib
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hipress.codec.errors import CaSyncError
from hipress.core.compression import CompressionAlgorithm, Uncompressed
from hipress.core.layout import PlanLayout, layout_plan
from hipress.core.plan import Plan

__all__ = [
    "Recompression",
    "build_kernels",
    "chunk_tensor_id",
    "decode_mean",
    "encode_reporting",
    "init_chunk_states",
    "measure_recompression",
    "rank_seed",
    "recompressible",
    "recompression",
    "resolve_algorithm",
]


def encode_reporting(
    alg: CompressionAlgorithm, grad: torch.Tensor, state: Any, out: torch.Tensor
) -> bool | torch.Tensor | None:
    """Encode ``grad`` into ``out``; return whether ``grad`` holds NaN/Inf where the algorithm
    finds out in the same pass (CompLL's ``encode_checked``: a bool, or a 0-d bool tensor on
    the device), else None (the caller reads ``grad`` for it: :mod:`hipress.codec.flags`)."""
    fused = getattr(alg, "encode_checked", None)
    if fused is not None:
        return fused(grad, state, out=out)[1]
    alg.encode(grad, state, out=out)
    return None


def decode_mean(
    alg: CompressionAlgorithm, payloads: Sequence[torch.Tensor], n: int, out: torch.Tensor
) -> None:
    """``out`` = the mean of the payloads' decodes (summed in float32 in order, then divided
    by their count, as ``decode`` + ``decode(accumulate=True)`` + ``div_`` compute it): with
    the algorithm's ``decode_sum`` where it has one (CompLL: one pass over ``out``)."""
    fused = getattr(alg, "decode_sum", None)
    if fused is not None:
        fused(payloads, n, out=out, divide_by=len(payloads))
        return
    for r, p in enumerate(payloads):
        alg.decode(p, n, out=out, accumulate=r > 0)
    out.div_(len(payloads))


def resolve_algorithm(
    algorithm: str | CompressionAlgorithm | None,
    params: Mapping[str, Any] | None = None,
    backend: str = "auto",
) -> CompressionAlgorithm:
    """Turn ``algorithm`` into an algorithm object.

    Takes a CompLL algorithm name (loaded with ``hipress.compll.load(name, backend=..., **params)``),
    an object that already has the :class:`CompressionAlgorithm` surface (``params`` must then be
    empty), or ``None``/``"none"`` for no compression. Returns the object (for no compression,
    :class:`~hipress.core.compression.Uncompressed`). Raises :class:`CaSyncError` for an unknown name
    or bad parameters.
    """
    if algorithm is None or algorithm == "none":
        if params:
            raise CaSyncError(f"algorithm=None takes no params, got {dict(params)}")
        return Uncompressed()
    if isinstance(algorithm, str):
        from hipress import compll  # deferred: CaSync's uncompressed path needs no compiler

        try:
            return compll.load(algorithm, backend=backend, **dict(params or {}))
        except (compll.CllError, TypeError, ValueError) as exc:
            raise CaSyncError(f"cannot load algorithm {algorithm!r}:\n{exc}") from exc
    if not isinstance(algorithm, CompressionAlgorithm):
        raise CaSyncError(
            f"algorithm must be a name, None or a CompLL Algorithm, got {type(algorithm).__name__}"
        )
    if params:
        raise CaSyncError("params are only accepted with an algorithm name, not an object")
    return algorithm


def build_kernels(alg: CompressionAlgorithm, devices: Iterable[torch.device | str]) -> None:
    """Build ``alg``'s kernels for every device in ``devices`` now (CompLL's
    ``Algorithm.build_kernels``: generate, compile or find in the kernel cache, load), so that no
    training step compiles; algorithms without ``build_kernels`` have nothing to build. Meta
    tensors' devices are skipped. Raises :class:`CaSyncError` where the kernels cannot run on a
    device (e.g. CUDA tensors without CuPy), saying why."""
    prep = getattr(alg, "build_kernels", None)
    if prep is None:
        return
    from hipress.compll import CllError  # deferred: CaSync's uncompressed path needs no compiler

    for device in dict.fromkeys(torch.device(d) for d in devices):
        if device.type == "meta":
            continue
        try:
            prep(device)
        except CllError as exc:
            raise CaSyncError(f"the {alg.name} kernels cannot run on {device}:\n{exc}") from exc


RECOMPRESS_VARIANCE_MAX = 4.0  # the error of compressing twice, against once, in variance


@dataclass(frozen=True)
class Recompression:
    """What compressing a decoded payload again (a PS server, each ring hop) costs an algorithm:
    ``once`` and ``twice`` are the squared errors, summed over the probes, of
    decode(encode(g)) and of decode(encode(decode(encode(g)))) against g; ``failed`` says why
    the probes could not run (the algorithm then counts as recompressible, as before any
    measurement)."""

    once: float
    twice: float
    failed: str | None = None

    @property
    def ok(self) -> bool:
        """Whether compressing twice keeps the error within ``RECOMPRESS_VARIANCE_MAX`` times
        that of compressing once."""
        return self.failed is not None or self.twice <= RECOMPRESS_VARIANCE_MAX * self.once + 1e-30

    @property
    def reason(self) -> str:
        """The measurement behind :attr:`ok`, in words."""
        if self.failed is not None:
            return f"not measured ({self.failed}): taken as recompressible"
        ratio = self.twice / self.once if self.once > 0 else float(self.twice > 0) or 1.0
        return (
            f"compressing twice: {ratio:.3g}x the squared error of compressing once "
            f"(at most {RECOMPRESS_VARIANCE_MAX:g}x)"
        )


def _reference(program: Any) -> Any:
    """A CompLL program on the reference interpreter (CPU tensors, whatever its backend)."""
    from hipress.compll import Algorithm
    from hipress.compll.backends.base import ReferenceBackend

    return Algorithm(program, ReferenceBackend(program))


def measure_recompression(alg: CompressionAlgorithm) -> Recompression:
    """Measure :class:`Recompression` for ``alg``: 8 random g of 16K elements (fixed seeds, so
    the result is a property of the algorithm, not of the call), on the CPU; a CompLL
    algorithm runs on the reference interpreter, whatever its backend."""
    program = getattr(alg, "program", None)
    return _measured(alg if program is None else _reference(program))


def _measured(probe: Any) -> Recompression:
    n, once, twice = 1 << 14, 0.0, 0.0
    try:
        for t in range(8):
            g = torch.randn(n, generator=torch.Generator().manual_seed(t))
            y1 = probe.decode(probe.encode(g, probe.init_state(n, seed=t + 1)), n)
            y2 = probe.decode(probe.encode(y1, probe.init_state(n, seed=t + 101)), n)
            once += float((y1 - g).square().sum())
            twice += float((y2 - g).square().sum())
    except Exception as exc:  # an algorithm the probes cannot run is not refused for it
        return Recompression(once, twice, failed=f"{type(exc).__name__}: {exc}"[:200])
    return Recompression(once, twice)


# The measurement is a function of the specialised program alone (fixed seeds, the reference
# interpreter): one per program, however many plans ask.
@functools.cache
def _program_recompression(program: Any) -> Recompression:
    return _measured(_reference(program))


def recompression(alg: CompressionAlgorithm) -> Recompression:
    """:class:`Recompression` of ``alg``: for a CompLL algorithm computed once per specialised
    program (the same object for every later call, on any backend); another algorithm object
    is measured on each call."""
    program = getattr(alg, "program", None)
    if program is not None:
        return _program_recompression(program)
    return measure_recompression(alg)


def recompressible(alg: CompressionAlgorithm) -> bool:
    """Whether compressing a decoded payload again (a PS server, each ring hop) keeps the error
    near that of compressing once: the mean squared error of decode(encode(decode(encode(g))))
    against g at most ``RECOMPRESS_VARIANCE_MAX`` times that of decode(encode(g))
    (:func:`recompression` holds the figures). Quantisers and error-feedback sparsifiers are
    (their decodes re-encode almost exactly); an unbiased random sparsifier (randomk with
    ``memory=False``: n/k times the variance again) is not."""
    return recompression(alg).ok


def rank_seed(seed: int, rank: int) -> int:
    """The RNG key (63 bits, non-negative) of ``rank``'s states: ``seed`` mixed with the rank, so
    workers draw independent random numbers and a rerun with the same seed draws the same ones."""
    # the key's text is part of every random draw: runs and checkpoints of earlier versions
    # reproduce only while it stays as it is
    digest = hashlib.sha256(f"hipress.casync:{seed}:{rank}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def chunk_tensor_id(key: str) -> int:
    """The 32-bit RNG stream of the state with :func:`~hipress.core.layout.chunk_key` ``key``:
    a CRC of the key."""
    return zlib.crc32(key.encode())


def init_chunk_states(
    algorithm: CompressionAlgorithm,
    plan: Plan,
    rank: int,
    world_size: int,
    seed: int,
    devices: Mapping[str, torch.device] | None = None,
    layout: PlanLayout | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Create every algorithm state rank ``rank`` needs under ``plan``, all zero.

    Returns ``(worker, server)``, dicts from state key to state: the states each chunk of
    ``layout`` (default: ``plan`` laid out for ``world_size`` and ``algorithm``) names for
    ``rank`` (:meth:`~hipress.core.layout.ChunkLayout.states`). States live on ``devices[name]``
    (default CPU) and draw from key :func:`rank_seed` and stream :func:`chunk_tensor_id`.
    """
    if layout is None:
        layout = layout_plan(plan, world_size, algorithm.payload_nbytes)
    worker: dict[str, Any] = {}
    server: dict[str, Any] = {}
    key_seed = rank_seed(seed, rank)
    for c in layout.all_chunks():
        device = (devices or {}).get(c.name, torch.device("cpu"))
        for key, n, is_server in c.states(rank, world_size):
            state = algorithm.init_state(
                n, device=device, seed=key_seed, tensor_id=chunk_tensor_id(key)
            )
            (server if is_server else worker)[key] = state
    return worker, server
