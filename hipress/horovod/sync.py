"""The transport: one parameter's gradient synchronised over Horovod's public async operations.

:class:`HorovodSync` holds the algorithm, the resolved plan and this rank's per-chunk algorithm
states (created by CaSync's :func:`~hipress.casync.algorithm.init_chunk_states`, so keys and
random streams are exactly CaSync's) and computes, per parameter, what
:class:`~hipress.casync.reference.ReferenceSync` defines:

- ALLREDUCE: ``allreduce_async_(op=Average)``, the call ``hvd.DistributedOptimizer`` makes, so an
  uncompressed gradient is bit for bit Horovod's.
- ALLGATHER: each partition is encoded; the payloads (each with an 8-byte trailer whose first
  byte is the non-finite flag, so every row of the gathered buffer starts 8-byte aligned, as
  the kernels need) are all-gathered; every rank decodes the N payloads in rank order into
  float32 and divides by N.
- PS: each partition splits into N shards, each encoded; an ``alltoall`` sends shard j of every
  worker to worker j, which decodes, sums, divides by N and re-encodes with its server state;
  an ``allgather`` (uneven sizes) returns every server's payload, decoded into its shard.

Operations are started with :meth:`HorovodSync.start` (from a gradient hook) and completed with
:meth:`HorovodSync.advance` (issues PS second phases) and :meth:`HorovodSync.finish`. Horovod
matches operations across ranks by name, so every name is unique per parameter and phase.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from hipress.casync.algorithm import (
    CompressionAlgorithm,
    chunk_key,
    decode_mean,
    encode_reporting,
    init_chunk_states,
)
from hipress.casync.bulk import split_sizes
from hipress.casync.errors import ConfigMismatchError
from hipress.casync.flags import Flag, FlagMode
from hipress.secopa.plan import Plan, PlanError, Strategy, TensorPlan

__all__ = ["HorovodSync", "Pending"]


FLAG_BYTES = 8  # the trailer after each payload: the non-finite flag, then zeros


def _with_flag(payload: torch.Tensor, bad: Flag) -> torch.Tensor:
    """``payload`` and its trailer (a multiple of 8 bytes, like the payload)."""
    msg = torch.empty(payload.numel() + FLAG_BYTES, dtype=torch.uint8, device=payload.device)
    msg[: payload.numel()].copy_(payload)
    FlagMode.write(msg[payload.numel() :], [bad])
    return msg


@dataclass
class _Chunk:
    """One partition in flight: its element range, strategy-specific handle and phase."""

    start: int
    size: int
    handle: Any
    phase: int = 1
    ctx: Any = None


@dataclass
class Pending:
    """A parameter's synchronisation in flight (returned by :meth:`HorovodSync.start`)."""

    name: str
    entry: TensorPlan
    grad: torch.Tensor
    chunks: list[_Chunk] = field(default_factory=list)


class HorovodSync:
    """Per-parameter gradient synchronisation over Horovod for one rank.

    Args:
        hvd: the ``horovod.torch`` module (initialised).
        algorithm: the compression algorithm, or None if the plan compresses nothing.
        plan: the resolved plan (every entry's name is a parameter name).
        seed: base seed of the random streams (each rank mixes in its rank).
        compression: Horovod ``Compression`` applied to uncompressed (allreduce) entries.
        gradient_predivide_factor: as in ``hvd.DistributedOptimizer`` (allreduce entries).
        devices: parameter name -> the device its gradient lives on (default CPU); the
            algorithm states, payloads and outputs live there too. Non-finite flags of CUDA
            gradients stay on the device (:mod:`hipress.casync.flags`).
    """

    def __init__(
        self,
        hvd: Any,
        algorithm: CompressionAlgorithm | None,
        plan: Plan,
        seed: int = 0,
        compression: Any = None,
        gradient_predivide_factor: float = 1.0,
        devices: Mapping[str, torch.device] | None = None,
    ) -> None:
        self.hvd = hvd
        self.algorithm = algorithm
        self.plan = plan
        self.seed = seed
        self.rank = hvd.rank()
        self.world_size = hvd.size()
        self.compression = compression if compression is not None else hvd.Compression.none
        self.predivide = gradient_predivide_factor
        self.entries = {e.name: e for e in plan.entries}
        ring = [e.name for e in plan.entries if e.strategy is Strategy.RING]
        if ring:
            raise PlanError(
                f"{ring[0]}{f' and {len(ring) - 1} more' if len(ring) > 1 else ''}: the ring "
                "strategy needs point-to-point messages, which Horovod does not offer; plan "
                "with strategies allgather and ps (hipress plan --strategies allgather,ps)"
            )
        if algorithm is not None:
            self.worker_states, self.server_states = init_chunk_states(
                algorithm, plan, self.rank, self.world_size, seed, devices
            )
        else:
            self.worker_states, self.server_states = {}, {}

    # ---- starting -----------------------------------------------------------------------------

    def start(self, name: str, grad: torch.Tensor) -> Pending:
        """Start synchronising parameter ``name``'s gradient ``grad`` (not modified).

        Returns the :class:`Pending` operation; every rank must start the same names.
        """
        e = self.entries[name]
        p = Pending(name, e, grad)
        if not e.compress:
            compressed, ctx = self.compression.compress(grad)
            handle = self.hvd.allreduce_async_(
                compressed,
                name=f"hipress.ar.{name}",
                op=self.hvd.Average,
                prescale_factor=1.0 / self.predivide,
                postscale_factor=self.predivide,
            )
            p.chunks.append(_Chunk(0, grad.numel(), handle, ctx=ctx))
            return p
        flat = grad.reshape(-1)
        pos = 0
        for k, size in enumerate(split_sizes(e.numel, e.partitions)):
            x = flat[pos : pos + size]
            if e.strategy is Strategy.PS:
                handle = self._start_ps(name, k, e.partitions, x)
            else:
                handle = self._start_allgather(name, k, e.partitions, x)
            p.chunks.append(_Chunk(pos, size, handle))
            pos += size
        return p

    def _encode(self, x: torch.Tensor, state: Any) -> tuple[torch.Tensor, Flag]:
        """x's payload, and whether x holds NaN/Inf (from the encode's own pass where the
        algorithm finds out there; on the device for CUDA tensors)."""
        assert self.algorithm is not None
        payload = torch.empty(
            self.algorithm.payload_nbytes(x.numel()), dtype=torch.uint8, device=x.device
        )
        bad = encode_reporting(self.algorithm, x, state, payload)
        return payload, FlagMode.for_tensor(x).from_encode(bad, x)

    def _start_allgather(self, name: str, k: int, parts: int, x: torch.Tensor) -> Any:
        key = chunk_key(name, k, parts)
        state = self.worker_states[key]
        payload, bad = self._encode(x, state)
        FlagMode.reset(state, bad)  # do not let NaN/Inf poison the error-feedback memory
        return self.hvd.allgather_async(_with_flag(payload, bad), name=f"hipress.ag.{key}")

    def _start_ps(self, name: str, k: int, parts: int, x: torch.Tensor) -> Any:
        encoded, states, pos = [], [], 0
        for j, s in enumerate(split_sizes(x.numel(), self.world_size)):
            states.append(self.worker_states[chunk_key(name, k, parts, shard=j)])
            encoded.append(self._encode(x[pos : pos + s], states[-1]))
            pos += s
        bad = FlagMode.any([b for _, b in encoded])  # the chunk's flag: any of its shards
        for state in states:
            FlagMode.reset(state, bad)
        msgs = [_with_flag(payload, bad) for payload, _ in encoded]
        splits = [m.numel() for m in msgs]
        return self.hvd.alltoall_async(
            torch.cat(msgs), splits=splits, name=f"hipress.ps1.{chunk_key(name, k, parts)}"
        )

    # ---- completing ---------------------------------------------------------------------------

    def advance(self, p: Pending) -> None:
        """Complete PS first phases of ``p`` (wait, merge, re-encode) and issue their second
        phase. No-op for other strategies. Call on every pending operation before
        :meth:`finish` so the second phases of all parameters overlap."""
        e = p.entry
        if not e.compress or e.strategy is not Strategy.PS:
            return
        assert self.algorithm is not None
        alg, n = self.algorithm, self.world_size
        for k, c in enumerate(p.chunks):
            if c.phase != 1:
                continue
            recv, _ = self.hvd.synchronize(c.handle)
            s = split_sizes(c.size, n)[self.rank]
            nb = alg.payload_nbytes(s)
            rows = recv.view(n, nb + FLAG_BYTES)
            merged = torch.empty(s, dtype=torch.float32, device=recv.device)
            decode_mean(alg, [rows[r, :nb] for r in range(n)], s, merged)
            (any_bad,) = FlagMode.for_tensor(recv).gathered(rows, nb, 1)
            key = chunk_key(p.name, k, e.partitions, shard=self.rank, server=True)
            state = self.server_states[key]
            msg = _with_flag(alg.encode(merged, state), any_bad)
            FlagMode.reset(state, any_bad)
            name = f"hipress.ps2.{chunk_key(p.name, k, e.partitions)}"
            c.handle = self.hvd.allgather_async(msg, name=name)
            c.phase = 2

    def finish(self, p: Pending) -> torch.Tensor:
        """Wait for ``p`` and return the synchronised gradient (shape and dtype of the input),
        the same on every rank."""
        e = p.entry
        if not e.compress:
            (c,) = p.chunks
            out = self.hvd.synchronize(c.handle)
            return self.compression.decompress(out, c.ctx)
        self.advance(p)
        result = torch.empty(e.numel, dtype=torch.float32, device=p.grad.device)
        for c in p.chunks:
            piece = result[c.start : c.start + c.size]
            if e.strategy is Strategy.PS:
                self._finish_ps(c, piece)
            else:
                self._finish_allgather(c, piece)
        return result.to(p.grad.dtype).view_as(p.grad)

    def _finish_allgather(self, c: _Chunk, out: torch.Tensor) -> None:
        assert self.algorithm is not None
        alg, n = self.algorithm, self.world_size
        nb = alg.payload_nbytes(c.size)
        rows = self.hvd.synchronize(c.handle).view(n, nb + FLAG_BYTES)
        (bad,) = FlagMode.for_tensor(rows).gathered(rows, nb, 1)
        if bad is True:
            out.fill_(float("nan"))
            return
        decode_mean(alg, [rows[r, :nb] for r in range(n)], c.size, out)
        FlagMode.fill_nan(out, bad)

    def _finish_ps(self, c: _Chunk, out: torch.Tensor) -> None:
        assert self.algorithm is not None
        alg = self.algorithm
        got = self.hvd.synchronize(c.handle)
        flags = FlagMode.for_tensor(got)
        pos_in, pos_out, bad = 0, 0, False
        for s in split_sizes(c.size, self.world_size):
            nb = alg.payload_nbytes(s)
            alg.decode(got[pos_in : pos_in + nb], s, out=out[pos_out : pos_out + s])
            (b,) = flags.read(got[pos_in + nb : pos_in + nb + 1])
            bad = FlagMode.either(bad, b)
            pos_in += nb + FLAG_BYTES
            pos_out += s
        FlagMode.fill_nan(out, bad)

    def describe(self) -> str:
        """A one-line description of the algorithm, plan digest and seed (what ranks compare)."""
        alg = self.algorithm
        what = f"{alg.name} {dict(alg.params)} [{alg.digest[:16]}]" if alg else "no compression"
        compressed = sum(e.compress for e in self.plan.entries)
        return (
            f"{what}; plan {self.plan.digest()} ({compressed}/{len(self.plan.entries)} "
            f"compressed); seed {self.seed}"
        )

    def check_agreement(self) -> None:
        """Collective: exchange :meth:`describe` with every rank (one ``allgather_object``) and
        raise :class:`ConfigMismatchError` on every rank if any differs, instead of exchanging
        payloads that receivers would misread."""
        every = self.hvd.allgather_object(self.describe(), name="hipress.config")
        if len(set(every)) > 1:
            lines = "\n".join(f"  rank {r}: {d}" for r, d in enumerate(every))
            raise ConfigMismatchError(
                "hipress.horovod ranks disagree; every rank must pass the same algorithm, "
                f"parameters, plan and seed:\n{lines}"
            )

    # ---- checkpoints --------------------------------------------------------------------------

    def config(self) -> dict[str, Any]:
        """What a checkpoint must match: algorithm digest, plan digest and seed."""
        alg = self.algorithm
        return {
            "algorithm": alg.digest if alg is not None else "none",
            "plan": self.plan.digest(),
            "seed": self.seed,
        }
