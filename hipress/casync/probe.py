"""CaSync's step probe for SeCoPa's calibration: real sync steps on synthetic gradients.

:class:`StateProbe` is a :class:`~hipress.secopa.measure.calibrate.StepProbe` over a state class (the
hook passes :class:`~hipress.casync.state.CaSyncState`, so this module needs no import of the
hook, which plans with it).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from hipress.core.plan import Plan
from hipress.secopa.model.selection import ddp_buckets

__all__ = ["StateProbe", "sync_step_ms"]


def sync_step_ms(state: Any, bufs: Sequence[torch.Tensor], names: Sequence[list[str]]) -> float:
    """ms of one CaSync step of ``state`` (a :class:`~hipress.casync.CaSyncState`) over every
    bucket (after a barrier; submitted in order, then awaited, on a GPU until the device is
    done), as DDP's hook would run it."""
    dist.barrier()
    t0 = time.perf_counter()
    futs = [
        state.submit(buf, bn, last=(j == len(bufs) - 1))
        for j, (buf, bn) in enumerate(zip(bufs, names, strict=True))
    ]
    for f in futs:
        f.wait()
    if bufs and bufs[0].is_cuda:
        torch.cuda.synchronize(bufs[0].device)
    return (time.perf_counter() - t0) * 1e3


class StateProbe:
    """CaSync's :class:`~hipress.secopa.measure.calibrate.StepProbe`: ``make_state`` is the state class
    (``CaSyncState``), called as ``make_state(algorithm, named_parameters=..., plan=...,
    process_group=..., log_every=0, device=...)``."""

    def __init__(self, make_state: Callable[..., Any]) -> None:
        self.make_state = make_state

    def __call__(
        self,
        algorithm: Any,
        plan: Plan,
        named: list[tuple[str, int]],
        group: Any,
        warmup: int,
        steps: int,
        device: Any = None,
    ) -> tuple[float, dict[str, float]]:
        """Run a state under ``plan`` on random gradients of ``named`` in DDP's buckets,
        ``warmup`` + ``steps`` steps. Returns the median step ms of the measured steps on this
        rank and the state's mean per-step figures over them. Every rank must call it."""
        return _run(self.make_state, algorithm, plan, named, group, warmup, steps, device)


def _run(
    make_state: Callable[..., Any], algorithm: Any, plan: Plan, named: list[tuple[str, int]],
    group: Any, warmup: int, steps: int, device: Any,
) -> tuple[float, dict[str, float]]:  # fmt: skip
    numels = [k for _, k in named]
    buckets = ddp_buckets(numels)
    gen = torch.Generator().manual_seed(1234 + dist.get_rank(group))
    bufs = [torch.randn(sum(numels[i] for i in b), generator=gen).to(device or "cpu")
            for b in buckets]  # fmt: skip
    names = [[named[i][0] for i in b] for b in buckets]
    # a subclass marked `probe`: its plan is a candidate, and its log line says so
    probe_state = type(f"Probe{make_state.__name__}", (make_state,), {"probe": True})
    state = probe_state(
        algorithm, named_parameters=named, plan=plan, process_group=group, log_every=0,
        device=device,
    )  # fmt: skip
    state._check.at_step = None  # (a probe measures its plan; it does not judge it)
    times = [sync_step_ms(state, bufs, names) for _ in range(warmup + steps)]
    return statistics.median(times[warmup:]), state.stats.mean(last=steps)
