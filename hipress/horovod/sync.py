"""The transport: one parameter's gradient synchronised over Horovod's public async operations.

:class:`HorovodSync` holds the algorithm, the resolved plan and this rank's per-chunk algorithm
states (created by :func:`~hipress.codec.algorithm.init_chunk_states`, as CaSync's are, so
keys and random streams are exactly CaSync's) and computes, per parameter, what
CaSync's single-process reference (``ReferenceSync``, which the tests compare against) defines:

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

from hipress.codec.algorithm import decode_mean, encode_reporting, init_chunk_states
from hipress.codec.checkpoint import load_states, save_states
from hipress.codec.errors import ConfigMismatchError
from hipress.codec.flags import Flag, FlagMode
from hipress.codec.rowsparse import row_state_key, row_states
from hipress.core.compression import CompressionAlgorithm, compresses
from hipress.core.layout import ChunkLayout, layout_plan
from hipress.core.plan import Plan, PlanError, Strategy, TensorPlan
from hipress.horovod import rowsparse
from hipress.horovod.errors import HorovodSyncError
from hipress.horovod.rowprobe import RowCounter, parse_decision

__all__ = ["HorovodSync", "Pending"]


FLAG_BYTES = 8  # the trailer after each payload: the non-finite flag, then zeros


def _with_flag(payload: torch.Tensor, bad: Flag) -> torch.Tensor:
    """``payload`` and its trailer (a multiple of 8 bytes, like the payload)."""
    msg = torch.empty(payload.numel() + FLAG_BYTES, dtype=torch.uint8, device=payload.device)
    msg[: payload.numel()].copy_(payload)
    FlagMode.write(msg[payload.numel() :], [bad])
    return msg


def _flag_of(msg: torch.Tensor, nbytes: int, mode: FlagMode) -> list[Flag]:
    """The flag of the message(s) ``msg`` (a row, or rows ORed) whose payload has ``nbytes``."""
    return mode.gathered(msg.view(-1, nbytes + FLAG_BYTES), nbytes, 1)


@dataclass
class _Chunk:
    """One partition in flight (or the uncompressed allreduce of the whole tensor): its
    strategy-specific handle and phase."""

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
        algorithm: the compression algorithm (``Uncompressed`` if the plan compresses nothing).
        plan: the resolved plan (every entry's name is a parameter name).
        seed: base seed of the random streams (each rank mixes in its rank).
        compression: Horovod ``Compression`` applied to uncompressed (allreduce) entries.
        gradient_predivide_factor: as in ``hvd.DistributedOptimizer`` (allreduce entries).
        devices: parameter name -> the device its gradient lives on (default CPU); the
            algorithm states, payloads and outputs live there too. Non-finite flags of CUDA
            gradients stay on the device (:mod:`hipress.codec.flags`).
        shapes: parameter name -> its shape (which embeddings may travel as rows).
        count_rows: count the embeddings' touched rows and decide which travel as rows
            (:mod:`hipress.horovod.rowprobe`); ``plan`` is then the plan run until the
            decision (:attr:`base_plan`), :attr:`plan` the one run now.
    """

    def __init__(
        self,
        hvd: Any,
        algorithm: CompressionAlgorithm,
        plan: Plan,
        seed: int = 0,
        compression: Any = None,
        gradient_predivide_factor: float = 1.0,
        devices: Mapping[str, torch.device] | None = None,
        shapes: Mapping[str, tuple[int, ...] | None] | None = None,
        count_rows: bool = False,
    ) -> None:
        self.hvd = hvd
        self.algorithm = algorithm
        self.plan = self.base_plan = plan
        self.devices = dict(devices or {})
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
        self.layout = layout_plan(plan, self.world_size, algorithm.payload_nbytes)
        self.worker_states, self.server_states = init_chunk_states(
            algorithm, plan, self.rank, self.world_size, seed, devices, layout=self.layout
        )
        self.worker_states.update(row_states(plan, self.rank, seed, self.devices))
        self.rows = RowCounter(plan, shapes or {}, count_rows)

    def _use(self, plan: Plan) -> None:
        """Run ``plan`` from now on (``base_plan`` with some embeddings as rows, or not): the
        row states of its compressed row entries are kept or made, the others dropped."""
        old = {row_state_key(e.name) for e in self.plan.entries if e.row_bound and e.compress}
        new = row_states(plan, self.rank, self.seed, self.devices)
        for key in old - set(new):
            del self.worker_states[key]
        for key, state in new.items():
            self.worker_states.setdefault(key, state)
        self.plan, self.entries = plan, {e.name: e for e in plan.entries}
        self.layout = layout_plan(plan, self.world_size, self.algorithm.payload_nbytes)

    def end_step(self) -> None:
        """After every ``synchronize()``: while embeddings' rows are counted, the collective
        that may take the row decision (every rank calls it as often)."""
        if self.rows.end_step(self.hvd) is not None:
            self._use(self.rows.decide(self.base_plan, self.world_size, self.rank))

    # ---- starting -----------------------------------------------------------------------------

    def start(self, name: str, grad: torch.Tensor) -> Pending:
        """Start synchronising parameter ``name``'s gradient ``grad`` (not modified).

        Returns the :class:`Pending` operation; every rank must start the same names.
        """
        e = self.entries[name]
        p = Pending(name, e, grad)
        self.rows.observe(name, grad)
        if e.row_bound:  # (hipress.horovod.rowsparse)
            p.chunks.append(_Chunk(rowsparse.start(self.hvd, name, grad)))
            return p
        if not e.compress:
            compressed, ctx = self.compression.compress(grad)
            handle = self.hvd.allreduce_async_(
                compressed,
                name=f"hipress.ar.{name}",
                op=self.hvd.Average,
                prescale_factor=1.0 / self.predivide,
                postscale_factor=self.predivide,
            )
            p.chunks.append(_Chunk(handle, ctx=ctx))
            return p
        flat = grad.reshape(-1)
        for c in self.layout[name]:
            x = flat[c.start : c.start + c.numel]
            if e.strategy is Strategy.PS:
                handle = self._start_ps(c, x)
            else:
                handle = self._start_allgather(c, x)
            p.chunks.append(_Chunk(handle))
        return p

    def _encode(self, x: torch.Tensor, state: Any, nbytes: int) -> tuple[torch.Tensor, Flag]:
        """x's payload (``nbytes``), and whether x holds NaN/Inf (from the encode's own pass
        where the algorithm finds out there; on the device for CUDA tensors)."""
        payload = torch.empty(nbytes, dtype=torch.uint8, device=x.device)
        bad = encode_reporting(self.algorithm, x, state, payload)
        return payload, FlagMode.for_tensor(x).from_encode(bad, x)

    def _start_allgather(self, c: ChunkLayout, x: torch.Tensor) -> Any:
        state = self.worker_states[c.key]
        payload, bad = self._encode(x, state, c.payloads[0])
        FlagMode.reset(state, bad)  # do not let NaN/Inf poison the error-feedback memory
        return self.hvd.allgather_async(_with_flag(payload, bad), name=f"hipress.ag.{c.key}")

    def _start_ps(self, c: ChunkLayout, x: torch.Tensor) -> Any:
        encoded, states = [], []
        for j, nbytes in enumerate(c.payloads):
            lo, hi = c.shard_span(j)
            states.append(self.worker_states[c.shard_key(j)])
            encoded.append(self._encode(x[lo:hi], states[-1], nbytes))
        bad = FlagMode.any([b for _, b in encoded])  # the chunk's flag: any of its shards
        for state in states:
            FlagMode.reset(state, bad)
        msgs = [_with_flag(payload, bad) for payload, _ in encoded]
        splits = [m.numel() for m in msgs]
        return self.hvd.alltoall_async(torch.cat(msgs), splits=splits, name=f"hipress.ps1.{c.key}")

    # ---- completing ---------------------------------------------------------------------------

    def advance(self, p: Pending) -> None:
        """Complete PS first phases of ``p`` (wait, merge, re-encode) and issue their second
        phase. No-op for other strategies. Call on every pending operation before
        :meth:`finish` so the second phases of all parameters overlap."""
        e = p.entry
        if e.row_bound:
            rowsparse.advance(self.hvd, self, p.name, e, p.grad, p.chunks[0].handle)
            return
        if not e.compress or e.strategy is not Strategy.PS:
            return
        alg, n = self.algorithm, self.world_size
        for lay, c in zip(self.layout[p.name], p.chunks, strict=True):
            if c.phase != 1:
                continue
            recv, _ = self.hvd.synchronize(c.handle)
            s, nb = lay.shards[self.rank], lay.payloads[self.rank]
            rows = recv.view(n, nb + FLAG_BYTES)
            merged = torch.empty(s, dtype=torch.float32, device=recv.device)
            decode_mean(alg, [rows[r, :nb] for r in range(n)], s, merged)
            (any_bad,) = _flag_of(rows, nb, FlagMode.for_tensor(recv))
            state = self.server_states[lay.shard_key(self.rank, server=True)]
            msg = _with_flag(alg.encode(merged, state), any_bad)
            FlagMode.reset(state, any_bad)
            c.handle = self.hvd.allgather_async(msg, name=f"hipress.ps2.{lay.key}")
            c.phase = 2

    def finish(self, p: Pending) -> torch.Tensor:
        """Wait for ``p`` and return the synchronised gradient (shape and dtype of the input),
        the same on every rank."""
        e = p.entry
        if e.row_bound:
            return rowsparse.finish(self.hvd, self, p.name, e, p.grad, p.chunks[0].handle)
        if not e.compress:
            (c,) = p.chunks
            out = self.hvd.synchronize(c.handle)
            return self.compression.decompress(out, c.ctx)
        self.advance(p)
        result = torch.empty(e.numel, dtype=torch.float32, device=p.grad.device)
        for lay, c in zip(self.layout[p.name], p.chunks, strict=True):
            piece = result[lay.start : lay.start + lay.numel]
            if e.strategy is Strategy.PS:
                self._finish_ps(lay, c.handle, piece)
            else:
                self._finish_allgather(lay, c.handle, piece)
        return result.to(p.grad.dtype).view_as(p.grad)

    def _finish_allgather(self, c: ChunkLayout, handle: Any, out: torch.Tensor) -> None:
        alg, n, nb = self.algorithm, self.world_size, c.payloads[0]
        rows = self.hvd.synchronize(handle).view(n, nb + FLAG_BYTES)
        (bad,) = _flag_of(rows, nb, FlagMode.for_tensor(rows))
        if bad is True:
            out.fill_(float("nan"))
            return
        decode_mean(alg, [rows[r, :nb] for r in range(n)], c.numel, out)
        FlagMode.fill_nan(out, bad)

    def _finish_ps(self, c: ChunkLayout, handle: Any, out: torch.Tensor) -> None:
        got = self.hvd.synchronize(handle)
        mode = FlagMode.for_tensor(got)
        pos, bad = 0, False
        for j, (s, nb) in enumerate(zip(c.shards, c.payloads, strict=True)):
            lo, hi = c.shard_span(j)
            msg = got[pos : pos + nb + FLAG_BYTES]
            self.algorithm.decode(msg[:nb], s, out=out[lo:hi])
            (b,) = _flag_of(msg, nb, mode)
            bad = FlagMode.either(bad, b)
            pos += nb + FLAG_BYTES
        FlagMode.fill_nan(out, bad)

    def describe(self) -> str:
        """A one-line description of the algorithm, plan digest (of :attr:`base_plan`) and
        seed (what ranks compare)."""
        alg = self.algorithm
        what = (
            f"{alg.name} {dict(alg.params)} [{alg.digest[:16]}]"
            if compresses(alg)
            else "no compression"
        )
        compressed = sum(e.compress for e in self.base_plan.entries)
        return (
            f"{what}; plan {self.base_plan.digest()} ({compressed}/{len(self.plan.entries)} "
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
        """What a checkpoint must match: algorithm digest, plan digest (of the plan given,
        :attr:`base_plan`) and seed."""
        alg = self.algorithm
        return {
            "algorithm": alg.digest,
            "plan": self.base_plan.digest(),
            "seed": self.seed,
        }

    def state_dict(self, fmt: str) -> dict[str, Any]:
        """This rank's algorithm states and row decision (sealed, CPU copies)."""
        parts = {"worker": self.worker_states, "server": self.server_states}
        extra = {"rows": self.rows.state_dict()}
        return save_states(fmt, self.rank, self.world_size, self.config(), parts, extra)

    def load_state_dict(self, sd: Mapping[str, Any], fmt: str) -> None:
        """Restore :meth:`state_dict` in place, all or nothing: the row decision first (the
        plan it makes, and its row states), then every state. Raises
        :class:`HorovodSyncError` naming the rank and what is wrong."""
        where, rows = f"rank {self.rank}", self.rows
        saved = sd.get("rows") if isinstance(sd, Mapping) else None
        before = (rows.measured, dict(rows.touched), self.plan, dict(self.worker_states))
        try:
            rows.measured = parse_decision(saved, rows.rows, where, HorovodSyncError)
            rows.touched.clear()
            self._use(rows.decide(self.base_plan, self.world_size, self.rank))
            load_states(
                sd, fmt=fmt, what="hipress.horovod", rank=self.rank,
                world_size=self.world_size, config=self.config(),
                parts={"worker": self.worker_states, "server": self.server_states},
                error=HorovodSyncError,
            )  # fmt: skip
        except BaseException:
            rows.measured, rows.touched, plan, worker = before
            self.worker_states.clear()
            self.worker_states.update(worker)
            self.plan, self.entries = plan, {e.name: e for e in plan.entries}
            self.layout = layout_plan(plan, self.world_size, self.algorithm.payload_nbytes)
            raise
