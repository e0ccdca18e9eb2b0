"""The outer codec of one tensor: its algorithm, its state and the error feedback of its outer
gradient.

An outer gradient (anchor weights minus local weights, flattened to float32) is encoded once
per outer sync. What the codec drops is kept and added to the next sync's outer gradient, so
the applied updates add up to the true ones, delayed rather than lost. The options, per tensor
of ``n`` elements:

- ``"own"``: the algorithm keeps its feedback in its own state (onebit, efsignsgd, topk, dgc,
  graddrop, tbq: a float32 array of ``n``).
- ``"fp32"``: an external float32 residual ``e``: ``c = g + e``, send ``encode(c)``, keep
  ``e = c - decode(encode(c))`` (4n bytes). The default for a deterministic codec without
  feedback of its own (signsgd, int8, fp16, bf16): each is biased, if only slightly.
- ``"none"``: no feedback: for unbiased random codecs (terngrad, qsgd, randomk without memory),
  and no compression at all.

A NaN/Inf in the outer gradient resets the memory (it would otherwise poison every later sync);
the caller makes the tensor's averaged outer gradient NaN on every rank.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hipress.codec.algorithm import encode_reporting
from hipress.codec.flags import Flag, FlagMode
from hipress.core.compression import CompressionAlgorithm, compresses
from hipress.diloco.errors import DiLoCoError

__all__ = ["FEEDBACK", "OuterCoder", "resolve_feedback"]

FEEDBACK = ("auto", "none", "fp32")


def own_feedback(alg: CompressionAlgorithm) -> bool:
    """Whether ``alg`` keeps error feedback in its own state (CompLL's ``error_feedback``)."""
    return bool(getattr(alg, "error_feedback", False))


def resolve_feedback(alg: CompressionAlgorithm, feedback: str) -> str:
    """The feedback to run for ``alg``: ``"own"``, ``"fp32"`` or ``"none"``.

    ``"auto"`` is ``"own"`` for an algorithm with feedback of its own, ``"none"`` for no
    compression or a codec that draws random numbers (unbiased by design), else ``"fp32"``.
    Raises :class:`DiLoCoError` for an unknown option, or ``"none"`` for an algorithm whose
    state always carries feedback."""
    if feedback not in FEEDBACK:
        raise DiLoCoError(f"feedback must be one of {', '.join(FEEDBACK)}; got {feedback!r}")
    if not compresses(alg):
        return "none"
    if own_feedback(alg):
        if feedback == "none":
            raise DiLoCoError(
                f"{alg.name} keeps its own error feedback in its state; pass feedback='auto' "
                "or 'fp32', or pick an algorithm without it (signsgd, terngrad, qsgd, int8)"
            )
        return "own"
    if feedback == "auto":
        return "none" if getattr(alg, "uses_random", False) else "fp32"
    return feedback


class OuterCoder:
    """Encodes one tensor's outer gradient (``n`` float32 elements) with ``alg`` under the
    resolved ``feedback``; its state lives on ``device`` and draws random numbers from key
    ``seed`` and stream ``tensor_id``.

    Fields: ``alg``, ``feedback``, ``n``, ``nbytes`` (the payload's size), ``state`` (the
    algorithm's), ``residual`` (the external residual, or None), ``last`` (a copy of the last
    payload this rank sent, for :meth:`owed`).
    """

    def __init__(
        self,
        alg: CompressionAlgorithm,
        feedback: str,
        n: int,
        device: torch.device,
        seed: int,
        tensor_id: int,
    ) -> None:
        self.alg, self.feedback, self.n = alg, feedback, n
        self.nbytes = alg.payload_nbytes(n)
        self.state = alg.init_state(n, device=device, seed=seed, tensor_id=tensor_id)
        self.residual = (
            torch.zeros(n, dtype=torch.float32, device=device) if feedback == "fp32" else None
        )
        self.last = torch.zeros(self.nbytes, dtype=torch.uint8, device=device)
        self.lost = False  # the last encode saw NaN/Inf: nothing is owed

    def encode(self, g: torch.Tensor, out: torch.Tensor, mode: FlagMode) -> Flag:
        """Encode the outer gradient ``g`` (``n`` contiguous float32 elements, not modified)
        into ``out`` (``nbytes`` bytes); return whether it held NaN/Inf (then the memory is
        reset)."""
        c = g if self.residual is None else torch.add(g, self.residual)
        flag = mode.from_encode(encode_reporting(self.alg, c, self.state, out), c)
        if self.residual is not None:
            torch.sub(c, self.alg.decode(out, self.n), out=self.residual)
            if isinstance(flag, torch.Tensor):
                self.residual.masked_fill_(flag, 0)
            elif flag:
                self.residual.zero_()
        FlagMode.reset(self.state, flag)
        self.last.copy_(out)
        self.lost = flag is True
        return flag

    def owed(self) -> torch.Tensor:
        """What this rank's sent outer gradients still owe (float32, ``n``): the sum of the
        outer gradients encoded so far minus the sum of their decodes. Zero without feedback."""
        if self.residual is not None:
            return self.residual.clone()
        tensors: Mapping[str, torch.Tensor] = getattr(self.state, "tensors", {})
        if self.feedback != "own" or self.lost or getattr(self.state, "step", 0) == 0:
            return torch.zeros(self.n, dtype=torch.float32, device=self.last.device)
        if "residual" in tensors:
            return tensors["residual"].float().clone()
        # the algorithm keeps the last compensated gradient: what it owes is that minus the
        # decode of what it sent
        return tensors["comp"].float() - self.alg.decode(self.last, self.n)

    def state_dict(self) -> dict[str, Any]:
        """A checkpointable copy (CPU tensors)."""
        sd: dict[str, Any] = {"alg": self.state.state_dict(), "last": self.last.cpu().clone(),
                              "lost": self.lost}  # fmt: skip
        if self.residual is not None:
            sd["residual"] = self.residual.cpu().clone()
        return sd

    def load_state_dict(self, sd: Mapping[str, Any], where: str) -> None:
        """Restore from :meth:`state_dict`. Raises :class:`DiLoCoError` naming ``where`` if it
        does not fit (nothing is changed then)."""
        try:
            last, residual = sd["last"], sd.get("residual")
            if (residual is None) != (self.residual is None):
                raise ValueError("it was saved with another feedback option")
            for name, got, mine in (("last", last, self.last), ("residual", residual,
                                                                self.residual)):  # fmt: skip
                if mine is not None and (
                    not isinstance(got, torch.Tensor) or got.shape != mine.shape
                    or got.dtype != mine.dtype
                ):  # fmt: skip
                    raise ValueError(f"`{name}` does not fit this tensor")
            backup = self.state.state_dict()
            self.state.load_state_dict(dict(sd["alg"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise DiLoCoError(f"{where}: the codec state does not fit: {exc}") from None
        try:
            self.last.copy_(last)
            if self.residual is not None:
                self.residual.copy_(residual)
            self.lost = bool(sd.get("lost", False))
        except BaseException:
            self.state.load_state_dict(backup)
            raise
