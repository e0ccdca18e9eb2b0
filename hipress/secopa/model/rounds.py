"""SeCoPa's price of a multi-round algorithm (:mod:`hipress.compll.rounds`) on one tensor.

A round's encode needs the sum of the round before it, so nothing in one tensor's step overlaps:
its time is the sum of every round's all-reduce (each of the payload's bytes, priced by the
network's ``allreduce`` op at the world size) and of its encodes and decode (measured, or given).
Across tensors, CaSync's rounds hook overlaps one bucket's rounds with the backward of the next,
which :func:`price_rounds` leaves to the caller (it prices one tensor's chain).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hipress.compll.rounds import RoundsAlgorithm
from hipress.secopa.model.costfn import AffineFloor

__all__ = ["RoundsCost", "measure_compute_ms", "measure_merge", "price_rounds"]


@dataclass(frozen=True)
class RoundsCost:
    """One tensor's step under a multi-round algorithm: each round's all-reduce (ms, in round
    order), the encodes and decode together (ms), and the uncompressed all-reduce of the same
    tensor (ms), for comparison."""

    rounds_ms: tuple[float, ...]
    compute_ms: float
    plain_ms: float

    @property
    def total_ms(self) -> float:
        return sum(self.rounds_ms) + self.compute_ms

    @property
    def speedup(self) -> float:
        """The uncompressed all-reduce's time over this one's (> 1: compression pays)."""
        return self.plain_ms / self.total_ms if self.total_ms > 0 else float("inf")


def price_rounds(alg: RoundsAlgorithm, shape: Sequence[int], world_size: int,
                 network: Mapping[str, Any], compute_ms: float = 0.0) -> RoundsCost:  # fmt: skip
    """The cost of ``alg`` on a float32 gradient of ``shape`` among ``world_size`` workers, with
    ``network["allreduce"]`` (a SeCoPa comm op: ``time(nbytes, world_size)``) and the encodes
    and decode taking ``compute_ms`` (e.g. :func:`measure_compute_ms`)."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if "allreduce" not in network:
        raise ValueError("the network has no `allreduce` op")
    op = network["allreduce"]
    n = int(torch.Size(shape).numel())
    rounds = tuple(float(op.time(b, world_size)) for b in alg.round_nbytes(shape))
    return RoundsCost(rounds, float(compute_ms), float(op.time(4 * n, world_size)))


def measure_compute_ms(alg: RoundsAlgorithm, shape: Sequence[int], repeats: int = 3,
                       budget_s: float = 0.0, device: torch.device | str | None = None) -> float:  # fmt: skip
    """The best of ``repeats`` timings of every encode and the decode of ``alg`` on a random
    float32 gradient of ``shape`` on ``device`` (default CPU; one worker: each sum is the
    worker's own payload), in ms; the first run, which builds the kernels, is not timed. With
    ``budget_s``, more timings follow while they fit in it (the best of many resists a busy
    CPU)."""
    g = torch.randn(tuple(shape), generator=torch.Generator().manual_seed(0)).to(device)
    state = alg.init_state(g.shape, g.device)
    wait = torch.cuda.synchronize if g.is_cuda else (lambda: None)
    alg.step(g, state, lambda x: x, 1)
    wait()
    best, start, done = float("inf"), time.perf_counter(), 0
    while done < max(1, repeats) or time.perf_counter() - start + best < budget_s:
        t0 = time.perf_counter()
        alg.step(g, state, lambda x: x, 1)
        wait()
        best, done = min(best, time.perf_counter() - t0), done + 1
    return best * 1e3


def measure_merge(sizes: tuple[int, int] = (1 << 14, 1 << 20), repeats: int = 3) -> AffineFloor:
    """A float32 read-write pass (``a += b``) over n elements, in ms: the best of ``repeats``
    timings at each of the two ``sizes``, joined by a line (never below the smaller time)."""
    (n1, n2), ts = sizes, []
    for n in sizes:
        a, b = torch.zeros(n), torch.ones(n)
        a.add_(b)
        best = float("inf")
        for _ in range(max(1, repeats)):
            t0 = time.perf_counter()
            a.add_(b)
            best = min(best, time.perf_counter() - t0)
        ts.append(best * 1e3)
    w = max(0.0, (ts[1] - ts[0]) / (n2 - n1))
    return AffineFloor(w, ts[0] - w * n1, min(ts))
