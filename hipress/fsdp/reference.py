"""The reference model of the compressed reduce-scatter: what N ranks compute, in one process,
from the algorithm's plain ``encode``/``decode`` and nothing of the runtime's code path but the
shared derivations of state keys and RNG streams (:func:`~hipress.core.layout.chunk_key`,
:func:`~hipress.codec.algorithm.rank_seed`, :func:`~hipress.codec.algorithm.chunk_tensor_id`).

Rank j's output is ``decode(p_0j) / d + decode(p_1j) / d + ...`` in float32, in rank order,
where ``p_rj`` encodes rank r's row j (plus its residual, with an external feedback), or all-NaN
when any rank's row j held NaN/Inf. Tests compare the real collective with it bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hipress.codec.algorithm import chunk_tensor_id, rank_seed
from hipress.core.compression import CompressionAlgorithm
from hipress.core.layout import chunk_key
from hipress.fsdp.feedback import builtin_feedback, check_bf16

__all__ = ["ReferenceReduceScatter"]


class ReferenceReduceScatter:
    """N ranks' reduce-scatters of one unit of ``numel`` elements, step after step.

    ``feedback`` is ``"none"``/``"fp32"`` (the algorithm's own state, or an external float32
    residual for an algorithm without feedback of its own), ``"bf16"`` (the residual, or the
    algorithm's float32 state arrays, rounded to bfloat16 after each step) or ``"int8"`` (the
    residual rounded to int8 steps of its block's absmax / 127, blocks of 256). Raises
    :class:`~hipress.fsdp.errors.FsdpError` for ``"bf16"`` where the collective does
    (:func:`~hipress.fsdp.feedback.check_bf16`)."""

    def __init__(
        self,
        unit: str,
        algorithm: CompressionAlgorithm,
        feedback: str,
        numel: int,
        world_size: int,
        seed: int = 0,
    ) -> None:
        if feedback == "bf16" and builtin_feedback(algorithm):
            check_bf16(algorithm)
        self.alg, self.feedback, self.n = algorithm, feedback, world_size
        self.rows = numel // world_size
        self.states = [
            [
                algorithm.init_state(self.rows, seed=rank_seed(seed, r),
                                     tensor_id=chunk_tensor_id(chunk_key(unit, 0, 1, shard=j)))
                for j in range(world_size)
            ]
            for r in range(world_size)
        ]  # fmt: skip
        external = not builtin_feedback(algorithm) and feedback != "none"
        self.residual = (
            [torch.zeros(world_size, self.rows) for _ in range(world_size)] if external else None
        )

    def step(self, inputs: Sequence[torch.Tensor], divide_by: float) -> list[torch.Tensor]:
        """Every rank's float32 output for ``inputs`` (rank r's flat input, N rows)."""
        n, alg = self.n, self.alg
        payloads: list[list[torch.Tensor]] = []
        bad = [False] * n
        for r in range(n):
            rows = inputs[r].reshape(n, self.rows).float()
            mine = []
            for j in range(n):
                g = rows[j].clone()
                state = self.states[r][j]
                if self.residual is not None:
                    g += self.residual[r][j]
                if not bool(torch.isfinite(g).all()):
                    bad[j] = True
                p = alg.encode(g, state)
                if self.residual is not None:
                    e = g - alg.decode(p, self.rows)
                    if self.feedback == "bf16":
                        e = e.bfloat16().float()
                    elif self.feedback == "int8":
                        e = _int8_round_trip(e)
                    self.residual[r][j] = e if bool(torch.isfinite(g).all()) else 0.0
                if not bool(torch.isfinite(g).all()):
                    state.reset()
                if self.feedback == "bf16" and builtin_feedback(alg):
                    for t in state.tensors.values():
                        if t.dtype == torch.float32 and t.dim() == 1:
                            t.copy_(t.bfloat16())
                mine.append(p)
            payloads.append(mine)
        out = []
        for j in range(n):
            acc = alg.decode(payloads[0][j], self.rows) / divide_by
            for r in range(1, n):
                acc = acc + alg.decode(payloads[r][j], self.rows) / divide_by
            out.append(torch.full_like(acc, float("nan")) if bad[j] else acc)
        return out


def _int8_round_trip(e: torch.Tensor, block: int = 256) -> torch.Tensor:
    """``e`` as an int8 residual stores it: per block of ``block``, ``s`` = absmax / 127 and
    each value rounded to the nearest multiple of ``s`` (zero padding completes the last)."""
    n = e.numel()
    padded = torch.cat([e, torch.zeros(-n % block)]).view(-1, block)
    s = padded.abs().amax(dim=1) / 127.0
    q = (padded / s.clamp_min(1e-38)[:, None]).round().clamp(-127, 127)
    return (q * s[:, None]).view(-1)[:n]
