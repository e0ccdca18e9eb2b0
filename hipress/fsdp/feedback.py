"""Error feedback for a sharded reduce-scatter: where the compression error is kept, and in
which precision.

Every rank encodes all N destination chunks of an FSDP unit's gradient, so any error-feedback
memory is the size of the *unsharded* unit on every rank: exactly the memory that sharding set
out to save. The options, per rank, for a unit of P elements:

- ``"none"``: no feedback (0 bytes). For unbiased algorithms (terngrad, qsgd, randomk with
  ``memory=False``) and the lossless casts; a biased algorithm then trains with its bias.
- ``"fp32"``: the full-precision residual (4P bytes). For an algorithm with its own feedback
  (onebit, efsignsgd, topk, dgc, graddrop, tbq) that is its own state; for any other, an
  external residual ``e``: ``c = g + e``, send ``encode(c)``, keep ``e = c - decode(encode(c))``.
- ``"bf16"``: the same memory stored in bfloat16 (2P bytes). An algorithm's own float32 state
  arrays are widened for the encode of one chunk (a transient of one chunk) and narrowed after.
  Refused for an algorithm whose state tells sent from kept elements by a stored threshold
  (topk, graddrop, dgc: :mod:`hipress.fsdp.thresholds`), which would lose gradient step after
  step; elsewhere the residual is rounded to bfloat16 once a step.
- ``"int8"``: an external residual in int8 with a float32 absmax scale per block of 256
  (about 1.02P bytes), as published low-memory feedback does; not for an algorithm's own state.

Each chunk is driven by one :class:`ChunkCoder`: ``encode`` writes the payload and returns the
chunk's non-finite flag (:mod:`hipress.codec.flags`: a bool on CPU, a 0-d device tensor on
CUDA, never read back), and a non-finite chunk resets its memory, so it cannot poison later
steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hipress.codec.algorithm import encode_reporting
from hipress.codec.flags import Flag, FlagMode
from hipress.core.compression import CompressionAlgorithm
from hipress.fsdp.errors import FsdpError
from hipress.fsdp.thresholds import threshold_compare

__all__ = ["FEEDBACK", "ChunkCoder", "check_bf16", "make_coder", "resolve_feedback"]

FEEDBACK = ("auto", "none", "fp32", "bf16", "int8")
INT8_BLOCK = 256


def builtin_feedback(alg: CompressionAlgorithm) -> bool:
    """Whether ``alg`` keeps error feedback in its own state (CompLL's ``error_feedback``)."""
    return bool(getattr(alg, "error_feedback", False))


def resolve_feedback(alg: CompressionAlgorithm, feedback: str) -> str:
    """The feedback option to run: ``"auto"`` is ``"fp32"`` for an algorithm with its own
    feedback, else ``"none"``. Raises :class:`FsdpError` for an unknown option, ``"none"`` for
    an algorithm whose state always carries feedback, and ``"int8"`` for such an algorithm."""
    if feedback not in FEEDBACK:
        raise FsdpError(f"feedback must be one of {', '.join(FEEDBACK)}; got {feedback!r}")
    own = builtin_feedback(alg)
    if feedback == "auto":
        return "fp32" if own else "none"
    if own and feedback in ("none", "int8"):
        raise FsdpError(
            f"{alg.name} keeps its own error feedback in float32 state; pass feedback='fp32' "
            "(as it is) or 'bf16' (stored in bfloat16), or pick an algorithm without feedback "
            "(signsgd, terngrad, qsgd, int8) for feedback='none' or 'int8'"
        )
    if own and feedback == "bf16":
        check_bf16(alg)
    return feedback


def check_bf16(alg: CompressionAlgorithm) -> None:
    """Raise :class:`FsdpError` if ``alg``'s own state cannot be stored in bfloat16 without
    losing gradient: its encode compares a state array with a stored threshold."""
    found = threshold_compare(alg)
    if found is None:
        return
    array, scalar = found
    raise FsdpError(
        f"feedback='bf16' cannot keep {alg.name}'s error feedback: its state tells the elements "
        f"it sent from those it kept by comparing `{array}` with the stored threshold "
        f"`{scalar}`, and rounding `{array}` to bfloat16 moves elements across it (their "
        "gradient is then dropped or sent twice, more every step); use feedback='fp32', or "
        "an algorithm whose state rounds safely (onebit, efsignsgd, tbq) with 'bf16'"
    )


def _state_bytes(state: Any, arrays_only: bool = False) -> int:
    """Bytes of ``state``'s tensors (``arrays_only``: of its per-element arrays)."""
    tensors: Mapping[str, torch.Tensor] = getattr(state, "tensors", {})
    return sum(t.numel() * t.element_size() for t in tensors.values()
               if t.dim() == 1 or not arrays_only)  # fmt: skip


class ChunkCoder:
    """Encodes one destination chunk with the algorithm's own state (``"none"``, or ``"fp32"``
    for an algorithm with its own feedback).

    Fields: ``alg``, ``state`` (the algorithm's per-chunk state), ``n`` (elements).
    """

    def __init__(self, alg: CompressionAlgorithm, state: Any, n: int) -> None:
        self.alg, self.state, self.n = alg, state, n

    def encode(self, grad: torch.Tensor, out: torch.Tensor, mode: FlagMode) -> Flag:
        """Encode ``grad`` (``n`` elements, any float dtype) into ``out``; return whether it
        held NaN/Inf (then the memory is reset)."""
        flag = mode.from_encode(encode_reporting(self.alg, grad, self.state, out), grad)
        FlagMode.reset(self.state, flag)
        return flag

    def feedback_bytes(self) -> int:
        """Bytes of error-feedback memory this chunk keeps (an algorithm's own: its state
        arrays)."""
        return _state_bytes(self.state, arrays_only=True) if builtin_feedback(self.alg) else 0

    def state_bytes(self) -> int:
        """Bytes of all persistent state this chunk keeps."""
        return _state_bytes(self.state)

    def state_dict(self) -> dict[str, Any]:
        """A checkpointable copy (CPU tensors)."""
        return {"alg": self.state.state_dict()}

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        """Restore from :meth:`state_dict`; raises :class:`FsdpError` if it does not fit."""
        try:
            self.state.load_state_dict(dict(sd["alg"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise FsdpError(f"compression state does not fit: {exc}") from exc


class PackedStateCoder(ChunkCoder):
    """An algorithm's own feedback, its float32 state arrays stored in bfloat16 between steps."""

    def __init__(self, alg: CompressionAlgorithm, state: Any, n: int) -> None:
        super().__init__(alg, state, n)
        tensors = state.tensors
        self.packed = [k for k, t in tensors.items() if t.dtype == torch.float32 and t.dim() == 1]
        for k in self.packed:
            tensors[k] = tensors[k].to(torch.bfloat16)

    def encode(self, grad: torch.Tensor, out: torch.Tensor, mode: FlagMode) -> Flag:
        tensors = self.state.tensors
        low = {k: tensors[k] for k in self.packed}
        for k in self.packed:
            tensors[k] = low[k].float()
        try:
            flag = super().encode(grad, out, mode)
            for k in self.packed:
                low[k].copy_(tensors[k])
        finally:
            tensors.update(low)
        return flag


class Residual:
    """An external residual of ``n`` elements stored in ``dtype`` (float32 or bfloat16), or in
    int8 with a float32 absmax scale per block of :data:`INT8_BLOCK` (``dtype`` int8)."""

    def __init__(self, n: int, dtype: torch.dtype, device: torch.device) -> None:
        self.n, self.dtype = n, dtype
        if dtype == torch.int8:
            blocks = -(-n // INT8_BLOCK)
            self.tensors = {
                "q": torch.zeros(blocks * INT8_BLOCK, dtype=torch.int8, device=device),
                "scale": torch.zeros(blocks, dtype=torch.float32, device=device),
            }
        else:
            self.tensors = {"e": torch.zeros(n, dtype=dtype, device=device)}

    def add_into(self, c: torch.Tensor) -> None:
        """``c += e`` (``c`` float32, ``n`` elements)."""
        if self.dtype != torch.int8:
            c.add_(self.tensors["e"])
            return
        q, scale = self.tensors["q"], self.tensors["scale"]
        e = (q.view(-1, INT8_BLOCK).float() * scale[:, None]).view(-1)
        c.add_(e[: self.n])

    def compensate(self, grad: torch.Tensor) -> torch.Tensor:
        """A new float32 tensor ``grad + e``, summed in float32 (``grad`` of ``n`` elements,
        any float dtype)."""
        flat = grad.reshape(-1)
        if self.dtype != torch.int8 and flat.dtype == torch.float32:  # one pass
            return torch.add(flat, self.tensors["e"], out=torch.empty_like(flat))
        c = flat.to(torch.float32, copy=True)
        self.add_into(c)
        return c

    def store_difference(self, c: torch.Tensor, decoded: torch.Tensor) -> None:
        """``e = c - decoded`` (rounded once to the storage precision; ``decoded`` may be
        overwritten)."""
        if self.dtype != torch.int8:
            torch.sub(c, decoded, out=self.tensors["e"])
            return
        self.store(torch.sub(c, decoded, out=decoded))

    def store(self, r: torch.Tensor) -> None:
        """``e = r`` (rounded to the storage precision)."""
        if self.dtype != torch.int8:
            self.tensors["e"].copy_(r)
            return
        q, scale = self.tensors["q"], self.tensors["scale"]
        if self.n == q.numel() and r.dtype == torch.float32 and r.is_contiguous():
            blocks = r.view(-1, INT8_BLOCK)
        else:
            padded = torch.zeros(q.numel(), dtype=torch.float32, device=r.device)
            padded[: self.n].copy_(r.reshape(-1))
            blocks = padded.view(-1, INT8_BLOCK)
        # max |x| as max(max x, -min x): two reductions, no |x| temporary (much faster)
        s = torch.maximum(blocks.amax(dim=1), blocks.amin(dim=1).neg()) / 127.0
        scale.copy_(s)
        q.copy_((blocks / s.clamp_min(1e-38)[:, None]).round_().clamp_(-127, 127).view(-1))

    def reset(self, flag: Flag) -> None:
        for t in self.tensors.values():
            if isinstance(flag, torch.Tensor):
                t.masked_fill_(flag, 0)
            elif flag:
                t.zero_()


class ResidualCoder(ChunkCoder):
    """An algorithm without feedback of its own, with an external residual: ``c = g + e``,
    payload ``encode(c)``, ``e = c - decode(payload)``."""

    def __init__(self, alg: CompressionAlgorithm, state: Any, n: int, residual: Residual) -> None:
        super().__init__(alg, state, n)
        self.residual = residual

    def encode(self, grad: torch.Tensor, out: torch.Tensor, mode: FlagMode) -> Flag:
        c = self.residual.compensate(grad)
        flag = mode.from_encode(encode_reporting(self.alg, c, self.state, out), c)
        self.residual.store_difference(c, self.alg.decode(out, self.n))
        FlagMode.reset(self.state, flag)
        self.residual.reset(flag)
        return flag

    def feedback_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.residual.tensors.values())

    def state_bytes(self) -> int:
        return _state_bytes(self.state) + self.feedback_bytes()

    def state_dict(self) -> dict[str, Any]:
        res = {k: v.detach().cpu().clone() for k, v in self.residual.tensors.items()}
        return {**super().state_dict(), "residual": res}

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        super().load_state_dict(sd)
        got = sd.get("residual")
        mine = self.residual.tensors
        if not isinstance(got, Mapping) or set(got) != set(mine):
            raise FsdpError(
                "compression state does not fit: its residual was saved with another feedback "
                "option; load it with the feedback it was saved with"
            )
        for k, v in got.items():
            if not isinstance(v, torch.Tensor) or v.shape != mine[k].shape:
                raise FsdpError(
                    f"compression state does not fit: residual `{k}` has the wrong shape"
                )
            if v.dtype != mine[k].dtype:
                raise FsdpError(
                    f"compression state does not fit: residual `{k}` is {v.dtype}, this run "
                    f"keeps {mine[k].dtype}; load it with the feedback it was saved with"
                )
            mine[k].copy_(v)


_RESIDUAL_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "int8": torch.int8}


def make_coder(
    alg: CompressionAlgorithm,
    feedback: str,
    n: int,
    device: torch.device,
    seed: int,
    tensor_id: int,
) -> ChunkCoder:
    """The coder of one chunk of ``n`` elements under the resolved ``feedback`` option
    (:func:`resolve_feedback`), its state on ``device`` drawing from RNG key ``seed`` and
    stream ``tensor_id``. Raises :class:`FsdpError` where :func:`check_bf16` does."""
    if builtin_feedback(alg) and feedback == "bf16":
        check_bf16(alg)
    state = alg.init_state(n, device=device, seed=seed, tensor_id=tensor_id)
    if builtin_feedback(alg):
        return PackedStateCoder(alg, state, n) if feedback == "bf16" else ChunkCoder(alg, state, n)
    if feedback == "none":
        return ChunkCoder(alg, state, n)
    return ResidualCoder(alg, state, n, Residual(n, _RESIDUAL_DTYPES[feedback], device))
