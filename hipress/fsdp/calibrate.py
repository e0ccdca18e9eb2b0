"""Calibration of ``plan="auto"``'s profile against hipress's own compressed reduce-scatter:
:func:`calibrate`.

Timed op by op, a profile prices encodes and decodes as they run alone; inside the collective
they share the cores with the transport's threads and carry the error feedback's reads and
writes, and cost more (the same reason CaSync calibrates DDP's profiles against its own
steps). So the planner runs one :class:`~hipress.fsdp.collective.CompressedReduceScatter` on a
probe unit in the group, subtracts the communication the profile predicts for it and scales
every compute cost by what is left over the predicted compute.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.distributed as dist

from hipress.core.compression import CompressionAlgorithm
from hipress.fsdp.collective import TRAILER, CompressedReduceScatter
from hipress.secopa.measure.calibrate import SCALE_RANGE
from hipress.secopa.measure.comm import TorchComm
from hipress.secopa.model.costmodel import CostModel
from hipress.secopa.model.formulas import reduce_scatter_formulas
from hipress.secopa.model.profile import Profile
from hipress.timing import ms_per_call

__all__ = ["PROBE_NUMEL", "calibrate"]

PROBE_NUMEL = 1 << 20  # elements of the probe unit, at most (the largest unit's, if smaller)
PROBE_REPS = 5


def calibrate(
    profile: Profile,
    algorithm: CompressionAlgorithm,
    feedback: str,
    group: Any,
    device: torch.device,
    numel: int,
) -> Profile:
    """``profile`` with ``compute_scale`` measured on a compressed reduce-scatter of
    ``min(numel, PROBE_NUMEL)`` float32 elements with ``feedback`` over ``group`` on ``device``:
    the slowest rank's median time less the predicted communication, over the predicted
    compute, clipped to :data:`~hipress.secopa.measure.calibrate.SCALE_RANGE`. The probe is recorded
    in ``meta["calibration"]``. Every rank of ``group`` must call it."""
    comm = TorchComm(group, device)
    ws, rank = comm.size, comm.rank
    n = max(ws, min(numel, PROBE_NUMEL) // ws * ws)
    probe = CompressedReduceScatter("probe", algorithm, feedback, n, ws, rank, device,
                                    seed_rank=dist.get_rank())  # fmt: skip
    inp = torch.randn(n, generator=torch.Generator().manual_seed(rank)).to(device)
    out = torch.empty(n // ws, device=device)

    def call() -> None:
        probe(out, inp, group, dist.ReduceOp.AVG)

    call()
    comm.barrier()
    mine = ms_per_call(call, PROBE_REPS, "median", device)
    measured = float(comm.all_reduce(torch.tensor([mine], dtype=torch.float64), "max").item())
    base = dataclasses.replace(profile, compute_scale=1.0, compute_scale_by_size=())
    model = CostModel(base, ws, reduce_scatter_formulas(4, TRAILER), 1)
    compute, wire = model.parts("compressed_reduce_scatter", n)
    ratio = (measured - wire) / compute if compute > 1e-3 else 1.0
    scale = min(max(ratio, SCALE_RANGE[0]), SCALE_RANGE[1])
    record = {
        "probe": "hipress.fsdp compressed reduce-scatter",
        "numel": n,
        "measured_ms": round(measured, 4),
        "predicted_compute_ms": round(compute, 4),
        "predicted_comm_ms": round(wire, 4),
        "compute_scale": round(scale, 4),
    }
    meta = {**profile.meta, "calibration": record}
    return dataclasses.replace(base, compute_scale=scale, meta=meta)
