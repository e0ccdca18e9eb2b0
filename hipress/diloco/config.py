"""The codec of each parameter, and what every rank must agree on.

``algorithm`` is a CompLL name, an algorithm object, ``None``/``"none"`` (uncompressed), or a
mapping from parameter name to any of those (every trainable parameter named once).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from hipress.codec.algorithm import build_kernels, resolve_algorithm
from hipress.codec.errors import CaSyncError
from hipress.core.compression import CompressionAlgorithm, compresses
from hipress.diloco.errors import DiLoCoError

__all__ = ["OUTER_FEEDBACK", "OUTER_PLAIN", "describe", "digest", "outer_defaults", "resolve_codecs"]

Choice = str | CompressionAlgorithm | None

# The default outer optimizer's settings (torch.optim.SGD keywords). Uncompressed: DiLoCo's
# Nesterov step. Where a codec keeps error feedback, the feedback memory already re-sends what
# earlier syncs left out, so momentum 0.9 overshoots; half of it, at lr 1, gained on both
# language models of ``hipress bench convergence`` and matched no momentum on a small task
# (docs/explanation/local-step-training.md has the figures).
OUTER_PLAIN: dict[str, Any] = {"lr": 0.7, "momentum": 0.9, "nesterov": True}
OUTER_FEEDBACK: dict[str, Any] = {"lr": 1.0, "momentum": 0.5, "nesterov": True}


def outer_defaults(feedback: Sequence[str]) -> dict[str, Any]:
    """The default outer SGD's keywords for tensors whose feedback options (``"own"``,
    ``"fp32"``, ``"none"``) are ``feedback``: :data:`OUTER_FEEDBACK` if any keeps error
    feedback, else :data:`OUTER_PLAIN` (a copy)."""
    return dict(OUTER_FEEDBACK if any(f != "none" for f in feedback) else OUTER_PLAIN)


def _one(choice: Choice, params: Mapping[str, Any] | None, backend: str, what: str
         ) -> CompressionAlgorithm:  # fmt: skip
    try:
        return resolve_algorithm(choice, params, backend)
    except CaSyncError as exc:
        raise DiLoCoError(f"{what}: {exc}") from None


def resolve_codecs(
    algorithm: Choice | Mapping[str, Choice],
    params: Mapping[str, Any] | None,
    names: Sequence[str],
    devices: Sequence[torch.device],
    backend: str = "auto",
) -> list[CompressionAlgorithm]:
    """The codec of each parameter in ``names`` (on ``devices``), its kernels built for that
    device. Raises :class:`DiLoCoError` for an unknown name, bad parameters, a mapping that
    misses or invents a parameter, or kernels that cannot run on a device."""
    if isinstance(algorithm, Mapping):
        unknown = sorted(set(algorithm) - set(names))
        missing = [n for n in names if n not in algorithm]
        if unknown or missing:
            raise DiLoCoError(
                "the algorithm mapping must name every trainable parameter once: "
                + (f"unknown {unknown[:3]}" if unknown else f"missing {missing[:3]}")
            )
        cache: dict[tuple[str, int], CompressionAlgorithm] = {}
        out = []
        for n in names:
            choice = algorithm[n]
            key = (choice if isinstance(choice, str) or choice is None else "", id(choice))
            if key not in cache:
                cache[key] = _one(choice, params, backend, f"algorithm for {n}")
            out.append(cache[key])
    else:
        out = [_one(algorithm, params, backend, "algorithm")] * len(names)
    for alg in {id(a): a for a in out}.values():
        devs = [d for a, d in zip(out, devices, strict=True) if a is alg]
        try:
            build_kernels(alg, devs)
        except CaSyncError as exc:
            raise DiLoCoError(str(exc)) from None
    return out


def describe(
    names: Sequence[str],
    shapes: Sequence[tuple[int, ...]],
    codecs: Sequence[CompressionAlgorithm],
    feedback: Sequence[str],
    fragments: Sequence[Sequence[int]],
    options: Mapping[str, Any],
) -> list[str]:
    """Lines that ranks compare: each parameter's shape, codec and feedback, the fragments
    and ``options`` (the schedule, seed, outer optimizer)."""
    lines = [f"{k}={v!r}" for k, v in sorted(options.items())]
    lines.append("fragments " + " | ".join(",".join(map(str, f)) for f in fragments))
    for n, s, a, f in zip(names, shapes, codecs, feedback, strict=True):
        what = f"{a.name} {dict(a.params)} [{a.digest}]" if compresses(a) else "none"
        lines.append(f"{n} {tuple(s)}: {what}, feedback {f}")
    return lines


def digest(lines: Sequence[str]) -> str:
    """A short content hash of :func:`describe`'s lines."""
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]
