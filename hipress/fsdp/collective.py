"""A compressed reduce-scatter for one FSDP2 unit: :class:`CompressedReduceScatter`, the
``ReduceScatter`` that ``FSDPModule.set_custom_reduce_scatter`` takes.

FSDP2 hands it the unit's padded gradients laid out for a reduce-scatter (``input`` viewed as
N rows, row j destined to rank j) and an output of one row. Each row is one chunk of the shared
layout (:func:`~hipress.core.layout.layout_tensor`: the unit as a PS entry of one partition, N
shards): every rank encodes each row with that chunk's state into block j of a send buffer,
one ``all_to_all_single`` delivers block j of every rank to rank j, and rank j decodes and sums
the N payloads straight into the output (``decode_sum``), scaled as ``op`` says. Each block ends
in an 8-byte trailer holding its chunk's non-finite flag: a NaN/Inf anywhere in the rows bound
for rank j makes rank j's whole output NaN.

Everything runs on the caller's current stream (FSDP2's reduce-scatter stream) with no read
back to the host: on CUDA the flags stay on the device, and the all_to_all's wait orders the
decode after it on that stream.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter

from hipress.codec.algorithm import chunk_tensor_id, rank_seed
from hipress.codec.flags import FlagMode
from hipress.core.compression import CompressionAlgorithm
from hipress.core.layout import ChunkLayout, layout_tensor
from hipress.core.plan import Strategy, TensorPlan
from hipress.core.release import settle_at_exit
from hipress.core.torchcompat import premul_sum_factor, reduce_scatter_single
from hipress.fsdp.errors import FsdpError
from hipress.fsdp.feedback import ChunkCoder, make_coder

__all__ = ["TRAILER", "CompressedReduceScatter", "UnitStats", "decode_sum", "divisor"]

log = logging.getLogger(__name__)
TRAILER = 8  # bytes after each payload: the chunk's non-finite flag, padded to 8


@dataclass
class UnitStats:
    """Counters of one unit's reduce-scatters on this rank.

    Fields:
        calls: reduce-scatters run.
        compressed_calls: of which compressed.
        sent_bytes: bytes this rank sent to other ranks (payloads and trailers).
        raw_bytes: bytes a plain reduce-scatter in the same dtype would have sent.
        nonfinite: compressed calls whose output was NaN (counted only where flags are host
            values, i.e. on CPU; on CUDA counting would read the device back).
    """

    calls: int = 0
    compressed_calls: int = 0
    sent_bytes: int = 0
    raw_bytes: int = 0
    nonfinite: int = 0


def divisor(op: Any, world_size: int) -> tuple[float, torch.Tensor | None]:
    """How FSDP2's ``op`` scales the sum: ``(d, t)`` with output = sum / d (times ``t`` when the
    factor is a tensor). SUM: d = 1; AVG: d = N; PREMUL_SUM(f): d = 1/f. Raises
    :class:`FsdpError` for any other op."""
    kind = getattr(op, "op", op)
    if kind == dist.ReduceOp.SUM:
        return 1.0, None
    if kind == dist.ReduceOp.AVG:
        return float(world_size), None
    if kind == dist.ReduceOp.PREMUL_SUM:
        factor = premul_sum_factor(op)
        if isinstance(factor, torch.Tensor):
            return 1.0, factor
        if isinstance(factor, int | float) and factor != 0:
            return 1.0 / float(factor), None
    raise FsdpError(f"a compressed reduce-scatter supports SUM, AVG and PREMUL_SUM, got {op!r}")


class CompressedReduceScatter(ReduceScatter):
    """The reduce-scatter of one FSDP unit of ``numel`` padded input elements among
    ``world_size`` ranks, compressed with ``algorithm`` when ``compress`` (else FSDP2's own
    ``reduce_scatter_single``).

    ``feedback`` is a resolved option of :func:`~hipress.fsdp.feedback.resolve_feedback`. States
    live on ``device`` and draw random numbers from :func:`~hipress.codec.algorithm.rank_seed`
    of ``seed`` and ``rank`` and the stream of each chunk's key, as CaSync's do. Raises
    :class:`FsdpError` if ``numel`` does not split into ``world_size`` equal rows.
    ``device_flags`` keeps non-finite flags as device tensors (default: on CUDA only; tests
    force it on a CPU to check that path). ``seed_rank`` (default ``rank``) is the rank mixed
    into the RNG key: the global rank, so that replicas of a shard group draw independently.
    """

    def __init__(
        self,
        unit: str,
        algorithm: CompressionAlgorithm,
        feedback: str,
        numel: int,
        world_size: int,
        rank: int,
        device: torch.device,
        compress: bool = True,
        seed: int = 0,
        device_flags: bool | None = None,
        seed_rank: int | None = None,
    ) -> None:
        if world_size < 1 or numel % world_size:
            raise FsdpError(f"{unit}: {numel} elements do not split into {world_size} rows")
        self.unit, self.algorithm, self.feedback = unit, algorithm, feedback
        self.numel, self.world_size, self.rank = numel, world_size, rank
        self.device, self.compress = torch.device(device), compress and numel >= world_size
        self.stats = UnitStats()
        self.device_flags = device_flags
        self.layout: ChunkLayout | None = None
        self.coders: list[ChunkCoder] = []
        if self.compress:
            entry = TensorPlan(unit, numel, compress=True, strategy=Strategy.PS, partitions=1)
            (self.layout,) = layout_tensor(entry, world_size, algorithm.payload_nbytes)
            key_seed = rank_seed(seed, rank if seed_rank is None else seed_rank)
            self.coders = [
                make_coder(algorithm, feedback, n, self.device, key_seed,
                           chunk_tensor_id(self.layout.shard_key(j)))
                for j, n in enumerate(self.layout.shards)
            ]  # fmt: skip
            self.block = self.layout.slot + TRAILER

    def __repr__(self) -> str:
        how = f"{self.algorithm.name}, feedback={self.feedback}" if self.compress else "plain"
        return f"CompressedReduceScatter({self.unit!r}, {self.numel} elements, {how})"

    def allocate(
        self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """A fresh buffer (FSDP2's default allocation)."""
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        op: Any,
        async_op: bool = False,
    ) -> dist.Work | None:
        """Reduce-scatter ``input_tensor`` (N rows) into ``output_tensor`` (this rank's row)
        over ``group``, scaled as ``op`` says. Returns a ``Work`` when ``async_op`` (the
        compressed path has already been issued on the current stream then), else None.
        Raises :class:`FsdpError` if the tensors or group do not match this unit."""
        settle_at_exit()
        self._check(output_tensor, input_tensor, group)
        self.stats.calls += 1
        ws = self.world_size
        self.stats.raw_bytes += input_tensor.numel() // ws * (ws - 1) * input_tensor.element_size()
        if not self.compress:
            return self._plain(output_tensor, input_tensor, group, op, async_op)
        d, tensor_factor = divisor(op, ws)
        self._compressed(output_tensor, input_tensor, group, d)
        if tensor_factor is not None:
            output_tensor.mul_(tensor_factor)
        return _completed(output_tensor) if async_op else None

    def _check(self, out: torch.Tensor, inp: torch.Tensor, group: dist.ProcessGroup) -> None:
        if group.size() != self.world_size or inp.numel() != self.numel:
            raise FsdpError(
                f"{self.unit}: registered for {self.numel} elements on {self.world_size} ranks, "
                f"called with {inp.numel()} on {group.size()}; register again after changing "
                "the model or the process group"
            )
        if out.numel() * self.world_size != inp.numel() or not (
            inp.is_contiguous() and out.is_contiguous()
        ):
            raise FsdpError(f"{self.unit}: reduce-scatter buffers are not N rows and one row")

    def _plain(
        self,
        out: torch.Tensor,
        inp: torch.Tensor,
        group: dist.ProcessGroup,
        op: Any,
        async_op: bool,
    ) -> dist.Work | None:
        self.stats.sent_bytes += (
            inp.numel() // self.world_size * (self.world_size - 1) * (inp.element_size())
        )
        kind = getattr(op, "op", op)
        if kind == dist.ReduceOp.PREMUL_SUM and dist.get_backend(group) == "gloo":
            factor = premul_sum_factor(op)  # gloo has no PREMUL_SUM: scale first, then sum
            inp.mul_(factor)
            op = dist.ReduceOp.SUM
        return reduce_scatter_single(out, inp, group=group, op=op, async_op=async_op)

    def _compressed(
        self, out: torch.Tensor, inp: torch.Tensor, group: dist.ProcessGroup, d: float
    ) -> None:
        layout, n, rank = self.layout, self.world_size, self.rank
        assert layout is not None  # compress implies a layout
        mode = FlagMode.for_tensor(inp, self.device_flags)
        flat = inp.view(-1)
        send = torch.empty(n * self.block, dtype=torch.uint8, device=inp.device)
        blocks = send.view(n, self.block)
        slot = layout.slot
        for j, coder in enumerate(self.coders):
            start, stop = layout.shard_span(j)
            flag = coder.encode(flat[start:stop], blocks[j, : layout.payloads[j]], mode)
            FlagMode.write(blocks[j, slot:], [flag])
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=group)
        got = recv.view(n, self.block)
        nbytes, size = layout.payloads[rank], layout.shards[rank]
        bad = mode.gathered(got, slot, 1)[0]
        decode_sum(self.algorithm, [got[r, :nbytes] for r in range(n)], size, out.view(-1), d)
        FlagMode.fill_nan(out, bad)
        self.stats.compressed_calls += 1
        self.stats.sent_bytes += (sum(layout.payloads) - nbytes) + (n - 1) * TRAILER
        if bad is True:
            self.stats.nonfinite += 1

    def feedback_bytes(self) -> int:
        """Bytes of error-feedback memory this unit keeps on this rank."""
        return sum(c.feedback_bytes() for c in self.coders)

    def state_bytes(self) -> int:
        """Bytes of all persistent compression state this unit keeps on this rank."""
        return sum(c.state_bytes() for c in self.coders)

    def state_dict(self) -> dict[str, Any]:
        """Every chunk's state (CPU copies), keyed by chunk index."""
        return {str(j): c.state_dict() for j, c in enumerate(self.coders)}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`; raises :class:`FsdpError` if it does not fit."""
        if set(sd) != {str(j) for j in range(len(self.coders))}:
            raise FsdpError(
                f"{self.unit}: the checkpoint holds {len(sd)} chunk states, this unit "
                f"{len(self.coders)}; was it saved with another world size or threshold?"
            )
        for j, c in enumerate(self.coders):
            c.load_state_dict(sd[str(j)])


def decode_sum(
    alg: CompressionAlgorithm,
    payloads: Sequence[torch.Tensor],
    n: int,
    out: torch.Tensor,
    d: float,
) -> None:
    """``out`` = sum of the payloads' decodes, each divided by ``d``, in float32, in order."""
    fused = getattr(alg, "decode_sum", None)
    if fused is not None:
        fused(payloads, n, out=out, divide_by=d)
        return
    acc = torch.zeros(n, dtype=torch.float32, device=out.device)
    for p in payloads:
        acc.add_(alg.decode(p, n).div_(d))
    out.copy_(acc)


def _completed(out: torch.Tensor) -> dist.Work:
    """A ``Work`` already complete (the compressed path was issued on the current stream)."""
    devices = [out.device] if out.is_cuda else []
    fut: torch.futures.Future[Any] = torch.futures.Future(devices=devices)
    fut.set_result([out])
    return torch._C._distributed_c10d._create_work_from_future(fut)
