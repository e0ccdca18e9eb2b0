"""The network profiler: measures the collectives of a profile's ``network`` on this cluster.

- :func:`measure_network` times allreduce, all_gather, all_to_all and broadcast at a few sizes
  in the current (or given) process group; each collective keeps its samples (its cost at
  this world size) and an alpha-beta fit (its cost at other world sizes); every rank must call
  it, and every rank gets the same result.
- :func:`measure_overlap` estimates how much an encode overlaps an in-flight collective.
- Both run over a :class:`~hipress.secopa.measure.comm.Comm`: ``torch.distributed`` by default, or
  Horovod's (``hipress.horovod``'s ``plan="auto"``).
- :func:`network_meta` records a measured network's provenance, :func:`bandwidth_summary`
  describes one op for people.

The compute half and the assembly of a profile are in :mod:`hipress.secopa.measure.profiler`; the
local multi-process variant for the CLI is :func:`hipress.secopa.measure.localgroup.measure_local`.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from hipress.secopa.measure.comm import Comm, TorchComm
from hipress.secopa.measure.profiler import Samples
from hipress.secopa.measure.timed_codec import TimedCodec
from hipress.secopa.model.profile import (
    ALGORITHMS,
    COLLECTIVES,
    GLOO_ALGORITHMS,
    AlphaBeta,
    CommOp,
    MeasuredComm,
    ProfileError,
)
from hipress.timing import ms_per_call

# bytes; every factor 4 from 128 KiB, where a shaped link's burst gives way to its rate (the
# rate fell from 11 to 8 MB/s per rank between 256 KiB and 2 MiB at 100 Mbit/s, and the
# payloads in between were priced up to 20% high by interpolating across the gap)
DEFAULT_NETWORK_SIZES = (1 << 10, 1 << 14, 1 << 17, 1 << 19, 1 << 21, 1 << 23)
DEFAULT_NETWORK_REPS = (20, 16, 10, 8, 5, 5)  # at least; more where a call is cheap:
NETWORK_REPS_BUDGET_MS = 150.0  # up to this much time per (collective, size),
NETWORK_REPS_MAX = 25  # and at most this many calls
# a collective whose largest default size took less than this is measured at 4x that size too
# (8 -> 32 MiB: DDP's buckets are 25 MiB), while 4x stays within these per-rank and total bytes
EXTEND_BELOW_MS = 30.0
EXTEND_TO = 1 << 25
EXTEND_TOTAL = 1 << 28
# the allreduce, which carries a model's uncompressed tensors whole, is also measured on up to
# the model's largest tensor (``largest``), in steps of 4x, where the next call is expected to
# take under LARGEST_BELOW_MS (its calls then add about a second at most) and stays within
# LARGEST_TO bytes per rank: on loopback a 200 MB
# allreduce cost 20% less per byte than the 8 -> 32 MiB segment continued to it
LARGEST_BELOW_MS = 250.0
LARGEST_TO = 1 << 30
LARGEST_REPS = 3
OVERLAP_REPS = 7  # calls of each of: encode alone, all_gather alone, both at once


@dataclass(frozen=True)
class NetworkSamples:
    """Per collective (per-rank bytes, ms) measured at ``world_size``, and the fitted ops."""

    world_size: int
    samples: Samples
    ops: Mapping[str, CommOp]
    backend: str = ""  # the transport measured over (e.g. gloo, horovod/gloo)


def fit_alpha_beta(
    op: str, sizes: Sequence[float], times: Sequence[float], world: int, algorithm: str
) -> AlphaBeta:
    """Fit ``T = A + S*B`` (relative least squares) and scale to per-step alpha and per-link
    beta with ``algorithm``'s coefficients at ``world``; alpha >= 0, beta > 0."""
    b = np.asarray(sizes, dtype=np.float64)
    t = np.asarray(times, dtype=np.float64)
    w = 1.0 / np.maximum(t, 1e-9)
    (s, a), *_ = np.linalg.lstsq(np.stack([b * w, w], axis=1), t * w, rcond=None)
    if s <= 0:  # flat timings: attribute everything to the largest size
        s, a = float(t.max() / b.max()), 0.0
    steps, factor = ALGORITHMS[algorithm](world)
    alpha = max(0.0, float(a)) / max(steps, 1)
    beta = max(float(s) / max(factor, 1e-12), 1e-15)
    return AlphaBeta(alpha, beta, (algorithm,))


def _comm(comm: Comm | None, group: Any, what: str, device: Any = None) -> Comm:
    """``comm``, or a :class:`TorchComm` over ``group`` on ``device`` (raises if there is no
    process group)."""
    if comm is not None:
        return comm
    if not dist.is_initialized():
        raise ProfileError(f"{what} needs an initialised process group")
    return TorchComm(group, device)


def _measure_sizes(
    comm: Comm,
    op: str,
    sizes: Sequence[int],
    reps: Sequence[int],
    *,
    extend: bool,
    largest: int | None,
) -> tuple[list[int], list[float]]:
    """Time collective ``op`` at ``sizes`` (bytes per rank), and beyond them as ``extend`` and
    ``largest`` ask (see :func:`measure_network`).

    Returns the sizes measured, in order, and this rank's median ms at each. Every rank must
    call it with the same arguments; the number of calls at a size, and whether to go on to a
    larger one, follow from the slowest rank's warm-up call, so every rank agrees on them.
    """
    device = getattr(comm, "device", None)  # None: the CPU
    grid = list(sizes)
    times: list[float] = []
    todo = list(zip(sizes, reps, strict=True))
    while todo:
        nbytes, r = todo.pop(0)
        call = comm.collective(op, nbytes)
        once = ms_per_call(call, 1, device=device)
        first = float(comm.all_reduce(torch.tensor([once], dtype=torch.float64), "max").item())
        # more calls where they are cheap (every rank agrees on the count)
        more = int(NETWORK_REPS_BUDGET_MS / max(first, 1e-3))
        comm.barrier()
        reps_now = max(r, min(NETWORK_REPS_MAX, more))
        times.append(ms_per_call(call, reps_now, "median", device))
        # on a fast network, up to DDP's 25 MiB buckets instead of extrapolating to them
        bigger = 4 * nbytes
        fits = bigger <= EXTEND_TO and bigger * comm.size <= EXTEND_TOTAL
        if extend and not todo and len(grid) == len(sizes) and first < EXTEND_BELOW_MS and fits:
            grid.append(bigger)
            todo.append((bigger, r))
        elif op == "allreduce" and largest is not None and not todo and nbytes < largest:
            nxt = min(bigger, largest, LARGEST_TO)
            if nxt > nbytes and first * nxt / nbytes < LARGEST_BELOW_MS:
                grid.append(nxt)
                todo.append((nxt, LARGEST_REPS))
    return grid, times


def measure_network(
    group: Any = None,
    sizes: Sequence[int] = DEFAULT_NETWORK_SIZES,
    reps: Sequence[int] = DEFAULT_NETWORK_REPS,
    algorithms: Mapping[str, tuple[str, ...]] = GLOO_ALGORITHMS,
    *,
    comm: Comm | None = None,
    extend: bool = True,
    largest: int | None = None,
) -> NetworkSamples:
    """Measure the four collectives in ``group`` (default: the default group), or over
    ``comm`` if given (e.g. Horovod's; ``group`` is then ignored).

    Every rank must call this with the same arguments. Each (collective, size) is warmed up
    once, then ``reps`` back-to-back calls after a barrier are timed one by one (more, up to
    ``NETWORK_REPS_MAX``, where they fit in ``NETWORK_REPS_BUDGET_MS`` at the warm-up call's
    slowest rank's time: on loopback the 8 MiB samples varied by +-25% with 5); the per-rank
    medians (robust to a call that lost the CPU on a busy machine, which a mean of two calls at
    8 MiB is not) are reduced with MAX so every rank returns identical samples and fits. Each
    collective becomes a :class:`MeasuredComm`: its samples price it at this world size, and
    an alpha-beta fit with the first of its ``algorithms`` extrapolates it (with all of them) to
    other world sizes. ``send`` (one hop of CaSync's ring) is measured too where ``comm`` has
    point-to-point messages; ``gather``/``bcast`` (the original's primitives), and ``send``
    elsewhere, reuse the allreduce's fitted per-step alpha and beta. With ``extend``, a
    collective whose largest size took under ``EXTEND_BELOW_MS`` is also measured at 4x that
    size (8 -> 32 MiB by default, what DDP's 25 MiB buckets need), within ``EXTEND_TO`` bytes
    per rank and ``EXTEND_TOTAL`` in all; so a fast network's big buckets are priced from a
    measurement, not from a line continued past 8 MiB. With ``largest`` (bytes per rank of the
    biggest uncompressed tensor to come), the allreduce goes on in steps of 4x up to it where
    that is cheap (``LARGEST_BELOW_MS``, ``LARGEST_TO``).
    """
    comm = _comm(comm, group, "measure_network")
    world = comm.size
    if world < 2:
        raise ProfileError("measure_network needs at least 2 processes")
    if len(sizes) != len(reps) or len(sizes) < 2:
        raise ProfileError("need as many repetition counts as sizes, at least two sizes")
    measured = (*COLLECTIVES, "send") if comm.point_to_point else COLLECTIVES
    results: list[float] = []
    grids: dict[str, list[int]] = {}
    for op in measured:
        grids[op], times = _measure_sizes(comm, op, sizes, reps, extend=extend, largest=largest)
        results.extend(times)
    timing = comm.all_reduce(torch.tensor(results, dtype=torch.float64), "max")
    flat = timing.tolist()
    samples: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {}
    ops: dict[str, CommOp] = {}
    at = 0
    for op in measured:
        grid = grids[op]
        ts = tuple(flat[at : at + len(grid)])
        at += len(grid)
        xs = tuple(float(s) for s in grid)
        if op == "all_to_all":
            xs = tuple(float(max(world, s // world * world)) for s in grid)
        samples[op] = (xs, ts)
        fit = fit_alpha_beta(op, xs, ts, world, algorithms[op][0])
        model = AlphaBeta(fit.alpha_ms, fit.beta_ms_per_byte, tuple(algorithms[op]))
        # at this world size the samples themselves; elsewhere the alpha-beta extrapolation
        ops[op] = MeasuredComm(world, xs, ts, model)
    ar = ops["allreduce"]
    assert isinstance(ar, MeasuredComm)
    ar = ar.model
    for op in ("send", "gather", "bcast"):
        if op in algorithms and op not in ops:
            ops[op] = AlphaBeta(ar.alpha_ms, ar.beta_ms_per_byte, tuple(algorithms[op]))
    return NetworkSamples(world, samples, ops, comm.backend)


def measure_collective(
    op: str,
    algorithm: str,
    group: Any = None,
    sizes: Sequence[int] = DEFAULT_NETWORK_SIZES,
    reps: Sequence[int] = DEFAULT_NETWORK_REPS,
    *,
    comm: Comm | None = None,
    device: Any = None,
) -> MeasuredComm:
    """Measure one collective of ``comm`` (default: a :class:`TorchComm` over ``group`` on
    ``device``) that :func:`measure_network` does not, such as ``reduce_scatter``, as it measures
    its own: the slowest rank's median at each of ``sizes`` (bytes per rank; extended on a fast
    network), its samples at this world size and an alpha-beta fit with ``algorithm`` (a name
    in :data:`~hipress.secopa.model.network.ALGORITHMS`) at others. Every rank must call it with the
    same arguments; every rank gets the same result. Raises :class:`ProfileError` for a group
    of one rank or a collective ``comm`` does not have."""
    comm = _comm(comm, group, "measure_collective", device)
    if comm.size < 2:
        raise ProfileError("measure_collective needs at least 2 processes")
    if algorithm not in ALGORITHMS:
        raise ProfileError(
            f"unknown collective algorithm {algorithm!r} (known: {list(ALGORITHMS)})"
        )
    grid, times = _measure_sizes(comm, op, sizes, reps, extend=True, largest=None)
    slowest = comm.all_reduce(torch.tensor(times, dtype=torch.float64), "max").tolist()
    xs = tuple(float(s) for s in grid)
    fit = fit_alpha_beta(op, xs, slowest, comm.size, algorithm)
    return MeasuredComm(comm.size, xs, tuple(float(t) for t in slowest), fit)


def matched_bytes(op: CommOp, world: int, ms: float) -> int:
    """The power of two in 1 KiB .. 8 MiB whose predicted time of ``op`` at ``world`` is
    closest to ``ms`` (in ratio)."""
    grid = np.array([float(1 << e) for e in range(10, 24)])
    t = np.maximum(np.asarray(op.time(grid, world), dtype=np.float64), 1e-9)
    return int(grid[int(np.argmin(np.abs(np.log(t / max(ms, 1e-9)))))])


def measure_overlap(
    codec: TimedCodec,
    group: Any = None,
    n: int = 1 << 18,
    *,
    comm: Comm | None = None,
    network: Mapping[str, CommOp] | None = None,
) -> float:
    """Fraction in [0, 1] of the shorter of (encode n elements, an all_gather) hidden when both
    run at once; the mean over ranks. Every rank must call it (over ``group``, or over
    ``comm`` if given).

    The all_gather carries 4n bytes per rank, or, given the measured ``network``, the size
    whose predicted time is closest to the encode's (the slowest rank's): the fraction is of
    the shorter of the two, so with an all_gather 200x longer than the encode (1 MB at 100
    Mbit/s against a 0.4 ms encode) the timer noise of the long one decides it.
    """
    comm = _comm(comm, group, "measure_overlap")
    dev = getattr(comm, "device", None)  # None: the CPU
    encode = codec.prepare(n)["encode"]
    encode()
    comm.barrier()
    t_c = ms_per_call(encode, 3, "median", dev)
    nbytes = 4 * n
    if network is not None and "all_gather" in network:
        slowest = float(comm.all_reduce(torch.tensor([t_c], dtype=torch.float64), "max").item())
        nbytes = matched_bytes(network["all_gather"], comm.size, slowest)
    gather = comm.collective("all_gather", nbytes)
    start_gather = comm.start_all_gather(nbytes)
    gather()
    start_gather()()
    comm.barrier()
    t_c = ms_per_call(encode, OVERLAP_REPS, "median", dev)
    comm.barrier()
    t_w = ms_per_call(gather, OVERLAP_REPS, "median", dev)
    both = []

    def together() -> None:
        wait = start_gather()
        encode()
        wait()

    for _ in range(OVERLAP_REPS):
        comm.barrier()
        both.append(ms_per_call(together, 1, device=dev))
    t_b = statistics.median(both)
    ov = (t_c + t_w - t_b) / max(min(t_c, t_w), 1e-9)
    out = comm.all_reduce(torch.tensor([min(1.0, max(0.0, ov))], dtype=torch.float64), "sum")
    return float(out.item()) / comm.size


def network_meta(net: NetworkSamples) -> dict[str, Any]:
    """Provenance of a measured network, for ``Profile.meta``."""
    return {
        "network_source": {
            "kind": "measured",
            "backend": net.backend or (dist.get_backend() if dist.is_initialized() else "gloo"),
            "world_size": net.world_size,
            "samples": {op: [list(x), list(t)] for op, (x, t) in net.samples.items()},
        }
    }


def bandwidth_summary(op: CommOp) -> str:
    """A human summary such as ``alpha 12.0 us, 1.25 GB/s`` of one network op."""
    if isinstance(op, MeasuredComm):
        xs, ts = op.sizes, op.times_ms
        rate = (xs[-1] - xs[0]) / max(ts[-1] - ts[0], 1e-9) * 1e3 / 1e9
        return (
            f"measured at N={op.world_size}: {ts[0] * 1e3:.1f} us at {xs[0]:.0f} B, "
            f"{rate:.3g} GB/s up to {xs[-1]:.0f} B; elsewhere {bandwidth_summary(op.model)}"
        )
    if isinstance(op, AlphaBeta):
        gbs = 1e3 / op.beta_ms_per_byte / 1e9
        return f"alpha {op.alpha_ms * 1e3:.1f} us, {gbs:.3g} GB/s"
    return "fitted"
