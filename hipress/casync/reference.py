"""The executable definition of what CaSync computes: one process plays every rank.

:class:`ReferenceSync` holds every rank's algorithm states and, given every rank's gradients,
returns the synchronised gradients, with none of the runtime's batching, pipelining, buffers or
collectives. Tests run the distributed hook and compare with it; for compressed tensors the two
must agree bit for bit (same states, same random streams, same order of floating-point
operations), for uncompressed ones up to the summation order of the backend's allreduce.

Semantics, per parameter and partition (a "chunk"; N workers, ``avg`` = divide by N):

- ALLREDUCE: ``sum_r(g_r / N)``.
- ALLGATHER: ``avg(sum_r decode(encode_r(g_r)))``, summed in rank order in float32.
- PS: the chunk splits into N shards; for shard j, server j computes
  ``m_j = avg(sum_r decode(encode_r(g_r[j])))`` and every worker receives
  ``decode(encode_server_j(m_j))``.
- RING: the chunk splits into N shards; shard j's partial sum starts at rank j+1,
  ``p = encode_{j+1}(g_{j+1}[j])``, and passes through ranks j+2, ..., j-1 (mod N), each
  computing ``p = encode_r(decode(p) + g_r[j])`` in float32; rank j computes
  ``m_j = (decode(p) + g_j[j]) / N`` and every worker receives ``decode(encode_server_j(m_j))``.
- If any rank's chunk holds NaN/Inf, the chunk is all-NaN on every rank and each state that
  encoded it is reset after encoding (RING: every state that encoded any of its shards, since
  the partial sums carry other ranks' values).

Results are cast to the gradients' dtype.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from hipress.codec.algorithm import init_chunk_states, resolve_algorithm
from hipress.core.compression import CompressionAlgorithm
from hipress.core.layout import ChunkLayout, layout_plan
from hipress.core.plan import Plan, Strategy

__all__ = ["ReferenceSync"]


def _finite(x: torch.Tensor) -> bool:
    return bool(torch.isfinite(x).all())


class ReferenceSync:
    """Every rank's CaSync computation in one process.

    Args:
        algorithm: the compression algorithm (None or ``Uncompressed`` if ``plan`` compresses
            nothing).
        plan: the resolved plan (``CaSyncState.plan``).
        world_size: N.
        seed: the base seed the runtime was given.
    """

    def __init__(
        self,
        algorithm: CompressionAlgorithm | None,
        plan: Plan,
        world_size: int,
        seed: int = 0,
    ) -> None:
        self.algorithm = resolve_algorithm(algorithm)
        self.plan = plan
        self.world_size = world_size
        self.layout = layout_plan(plan, world_size, self.algorithm.payload_nbytes)
        self.worker: list[dict[str, Any]] = []
        self.server: list[dict[str, Any]] = []
        for r in range(world_size):
            w, s = init_chunk_states(self.algorithm, plan, r, world_size, seed, layout=self.layout)
            self.worker.append(w)
            self.server.append(s)

    def step(self, grads: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Synchronise one step: ``grads[r][name]`` is rank r's gradient of ``name``.

        Returns name -> synchronised gradient (flattened, in the gradients' dtype), the same on
        every rank. Advances the states like the runtime does.
        """
        n = self.world_size
        if len(grads) != n:
            raise ValueError(f"need {n} ranks' gradients, got {len(grads)}")
        out = {}
        for e in self.plan.entries:
            gs = [g[e.name].reshape(-1) for g in grads]
            if not e.compress:
                acc = gs[0] / n
                for g in gs[1:]:
                    acc = acc + g / n
                out[e.name] = acc
                continue
            pieces = []
            for c in self.layout[e.name]:
                chunk = [g[c.start : c.start + c.numel] for g in gs]
                if e.strategy is Strategy.PS:
                    pieces.append(self._ps(c, chunk))
                elif e.strategy is Strategy.RING:
                    pieces.append(self._ring(c, chunk))
                else:
                    pieces.append(self._allgather(c, chunk))
            out[e.name] = torch.cat(pieces).to(gs[0].dtype)
        return out

    def _encode(self, x: torch.Tensor, state: Any, bad: bool) -> torch.Tensor:
        payload = self.algorithm.encode(x, state)
        if bad:
            state.reset()
        return payload

    def _allgather(self, c: ChunkLayout, chunk: list[torch.Tensor]) -> torch.Tensor:
        alg, n = self.algorithm, self.world_size
        bad = [not _finite(x) for x in chunk]
        payloads = [self._encode(x, self.worker[r][c.key], bad[r]) for r, x in enumerate(chunk)]
        size = c.numel
        if any(bad):
            return torch.full((size,), float("nan"))
        acc = torch.empty(size, dtype=torch.float32)
        for r, p in enumerate(payloads):
            alg.decode(p, size, out=acc, accumulate=r > 0)
        return acc.div_(n)

    def _ps(self, c: ChunkLayout, chunk: list[torch.Tensor]) -> torch.Tensor:
        alg, n = self.algorithm, self.world_size
        bad_chunk = [not _finite(x) for x in chunk]
        any_bad = any(bad_chunk)
        results = []
        for j, s in enumerate(c.shards):
            lo, hi = c.shard_span(j)
            payloads = [
                self._encode(x[lo:hi], self.worker[r][c.shard_key(j)], bad_chunk[r])
                for r, x in enumerate(chunk)
            ]
            merged = torch.empty(s, dtype=torch.float32)
            for r, p in enumerate(payloads):
                alg.decode(p, s, out=merged, accumulate=r > 0)
            merged.div_(n)
            back = self._encode(merged, self.server[j][c.shard_key(j, server=True)], any_bad)
            results.append(alg.decode(back, s, out=torch.empty(s, dtype=torch.float32)))
        if any_bad:
            return torch.full((c.numel,), float("nan"))
        return torch.cat(results)

    def _ring(self, c: ChunkLayout, chunk: list[torch.Tensor]) -> torch.Tensor:
        alg, n = self.algorithm, self.world_size
        bad = any(not _finite(x) for x in chunk)
        results = []
        for j, s in enumerate(c.shards):
            lo, hi = c.shard_span(j)
            shard = [x[lo:hi] for x in chunk]
            first = (j + 1) % n
            payload = self._encode(shard[first], self.worker[first][c.shard_key(j)], bad)
            acc = torch.empty(s, dtype=torch.float32)
            for step in range(2, n + 1):
                r = (j + step) % n
                alg.decode(payload, s, out=acc)
                acc.add_(shard[r])
                if r == j:
                    acc.div_(n)
                    state = self.server[j][c.shard_key(j, server=True)]
                else:
                    state = self.worker[r][c.shard_key(j)]
                payload = self._encode(acc, state, bad)
            results.append(alg.decode(payload, s, out=torch.empty(s, dtype=torch.float32)))
        if bad:
            return torch.full((c.numel,), float("nan"))
        return torch.cat(results)
