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

from hipress.casync.algorithm import CompressionAlgorithm, chunk_key, init_chunk_states
from hipress.casync.bulk import split_sizes
from hipress.secopa.plan import Plan, Strategy

__all__ = ["ReferenceSync"]


def _finite(x: torch.Tensor) -> bool:
    return bool(torch.isfinite(x).all())


class ReferenceSync:
    """Every rank's CaSync computation in one process.

    Args:
        algorithm: the compression algorithm (None if ``plan`` compresses nothing).
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
        self.algorithm = algorithm
        self.plan = plan
        self.world_size = world_size
        self.worker: list[dict[str, Any]] = []
        self.server: list[dict[str, Any]] = []
        for r in range(world_size):
            w, s = (
                init_chunk_states(algorithm, plan, r, world_size, seed)
                if algorithm is not None
                else ({}, {})
            )
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
            pieces, pos = [], 0
            for k, size in enumerate(split_sizes(e.numel, e.partitions)):
                chunk = [g[pos : pos + size] for g in gs]
                if e.strategy is Strategy.PS:
                    pieces.append(self._ps(e.name, k, e.partitions, chunk))
                elif e.strategy is Strategy.RING:
                    pieces.append(self._ring(e.name, k, e.partitions, chunk))
                else:
                    pieces.append(self._allgather(e.name, k, e.partitions, chunk))
                pos += size
            out[e.name] = torch.cat(pieces).to(gs[0].dtype)
        return out

    def _encode(self, x: torch.Tensor, state: Any, bad: bool) -> torch.Tensor:
        alg = self.algorithm
        assert alg is not None
        payload = alg.encode(x, state)
        if bad:
            state.reset()
        return payload

    def _allgather(self, name: str, k: int, parts: int, chunk: list[torch.Tensor]) -> torch.Tensor:
        alg, n = self.algorithm, self.world_size
        assert alg is not None
        key = chunk_key(name, k, parts)
        bad = [not _finite(x) for x in chunk]
        payloads = [self._encode(x, self.worker[r][key], bad[r]) for r, x in enumerate(chunk)]
        size = chunk[0].numel()
        if any(bad):
            return torch.full((size,), float("nan"))
        acc = torch.empty(size, dtype=torch.float32)
        for r, p in enumerate(payloads):
            alg.decode(p, size, out=acc, accumulate=r > 0)
        return acc.div_(n)

    def _ps(self, name: str, k: int, parts: int, chunk: list[torch.Tensor]) -> torch.Tensor:
        alg, n = self.algorithm, self.world_size
        assert alg is not None
        size = chunk[0].numel()
        bad_chunk = [not _finite(x) for x in chunk]
        any_bad = any(bad_chunk)
        shards = split_sizes(size, n)
        results = []
        pos = 0
        for j, s in enumerate(shards):
            key = chunk_key(name, k, parts, shard=j)
            payloads = [
                self._encode(x[pos : pos + s], self.worker[r][key], bad_chunk[r])
                for r, x in enumerate(chunk)
            ]
            merged = torch.empty(s, dtype=torch.float32)
            for r, p in enumerate(payloads):
                alg.decode(p, s, out=merged, accumulate=r > 0)
            merged.div_(n)
            server = self.server[j][chunk_key(name, k, parts, shard=j, server=True)]
            back = self._encode(merged, server, any_bad)
            results.append(alg.decode(back, s, out=torch.empty(s, dtype=torch.float32)))
            pos += s
        if any_bad:
            return torch.full((size,), float("nan"))
        return torch.cat(results)

    def _ring(self, name: str, k: int, parts: int, chunk: list[torch.Tensor]) -> torch.Tensor:
        alg, n = self.algorithm, self.world_size
        assert alg is not None
        size = chunk[0].numel()
        bad = any(not _finite(x) for x in chunk)
        results = []
        pos = 0
        for j, s in enumerate(split_sizes(size, n)):
            shard = [x[pos : pos + s] for x in chunk]
            first = (j + 1) % n
            payload = self._encode(
                shard[first], self.worker[first][chunk_key(name, k, parts, j)], bad
            )
            acc = torch.empty(s, dtype=torch.float32)
            for step in range(2, n + 1):
                r = (j + step) % n
                alg.decode(payload, s, out=acc)
                acc.add_(shard[r])
                if r == j:
                    acc.div_(n)
                    state = self.server[j][chunk_key(name, k, parts, shard=j, server=True)]
                else:
                    state = self.worker[r][chunk_key(name, k, parts, shard=j)]
                payload = self._encode(acc, state, bad)
            results.append(alg.decode(payload, s, out=torch.empty(s, dtype=torch.float32)))
            pos += s
        if bad:
            return torch.full((size,), float("nan"))
        return torch.cat(results)
