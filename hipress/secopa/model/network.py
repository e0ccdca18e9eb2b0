"""Network costs: alpha-beta collectives that extrapolate to any world size, and fitted ones.

:class:`AlphaBeta` prices a collective as ``min over its algorithms of a(N)*alpha +
b(N)*B*beta`` (:data:`ALGORITHMS` holds a(N), b(N)); :class:`FittedComm` is a cost fitted
directly in bytes at one world size (the original's form); :func:`link_network` builds every op
from a user-given link.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from hipress.secopa.model.costfn import CostFn, costfn_from_dict


class ProfileError(ValueError):
    """A profile is malformed or lacks a cost the cost model needs."""


def _log2(n: int) -> int:
    return max(0, math.ceil(math.log2(n))) if n > 1 else 0


# Each collective algorithm: world size N -> (latency steps a, bandwidth factor b), so that
# time = a*alpha + b*B*beta with B the per-rank size of the collective (see CommOp).
ALGORITHMS: Mapping[str, Callable[[int], tuple[float, float]]] = MappingProxyType(
    {
        # allreduce, B = tensor bytes
        "ring_allreduce": lambda n: (2 * (n - 1), 2 * (n - 1) / n),
        "rhd_allreduce": lambda n: (2 * _log2(n), 2 * (n - 1) / n),  # recursive halving-doubling
        # all_gather, B = bytes each rank contributes (output is N*B)
        "ring_allgather": lambda n: (n - 1, n - 1),
        "rd_allgather": lambda n: (_log2(n), n - 1),  # recursive doubling
        # all_to_all, B = bytes of each rank's whole send buffer (N blocks of B/N)
        "pairwise_alltoall": lambda n: (n - 1, (n - 1) / n),
        # reduce_scatter, B = bytes of each rank's input (N rows of B/N, one kept)
        "ring_reducescatter": lambda n: (n - 1, (n - 1) / n),
        # broadcast, B = tensor bytes
        "binomial_broadcast": lambda n: (_log2(n), _log2(n)),
        "scatter_allgather_broadcast": lambda n: (_log2(n) + n - 1, 2 * (n - 1) / n),
        # point-to-point and the original's PS primitives (root link is the bottleneck)
        "p2p": lambda n: (1, 1),
        "linear_gather": lambda n: (n - 1, n - 1),
        "linear_bcast": lambda n: (n - 1, n - 1),
    }
)

#: Algorithms per collective for a generic cluster (NCCL-like: ring or tree by size).
CLUSTER_ALGORITHMS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "allreduce": ("ring_allreduce", "rhd_allreduce"),
        "all_gather": ("ring_allgather", "rd_allgather"),
        "all_to_all": ("pairwise_alltoall",),
        "broadcast": ("binomial_broadcast", "scatter_allgather_broadcast"),
        "send": ("p2p",),
        "gather": ("linear_gather",),
        "bcast": ("linear_bcast",),
    }
)

#: Algorithms gloo uses (what a measured gloo profile extrapolates with).
GLOO_ALGORITHMS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "allreduce": ("ring_allreduce",),
        "all_gather": ("ring_allgather",),
        "all_to_all": ("pairwise_alltoall",),
        "broadcast": ("binomial_broadcast",),
        "send": ("p2p",),
        "gather": ("linear_gather",),
        "bcast": ("linear_bcast",),
    }
)


@dataclass(frozen=True)
class AlphaBeta:
    """Alpha-beta cost of one collective: ``min over algorithms of a(N)*alpha + b(N)*B*beta``.

    Fields:
        alpha_ms: per-step latency in ms.
        beta_ms_per_byte: ms per byte on one link.
        algorithms: names in :data:`ALGORITHMS`; the cheapest is taken at each size.
    """

    alpha_ms: float
    beta_ms_per_byte: float
    algorithms: tuple[str, ...]

    def __post_init__(self) -> None:
        if not (self.alpha_ms >= 0 and self.beta_ms_per_byte > 0):
            raise ProfileError(f"collective needs alpha >= 0 and beta > 0: {self}")
        unknown = [a for a in self.algorithms if a not in ALGORITHMS]
        if not self.algorithms or unknown:
            raise ProfileError(
                f"unknown collective algorithms {unknown} (known: {list(ALGORITHMS)})"
            )

    def coefficients(self, world_size: int) -> list[tuple[float, float]]:
        """Per algorithm, (latency ms, ms per byte) at this world size."""
        out = []
        for name in self.algorithms:
            a, b = ALGORITHMS[name](world_size)
            out.append((a * self.alpha_ms, b * self.beta_ms_per_byte))
        return out

    def time(self, nbytes: ArrayLike, world_size: int) -> NDArray[np.float64]:
        """Predicted ms for ``nbytes`` (per-rank size) at ``world_size``; 0 when N == 1."""
        b = np.asarray(nbytes, dtype=np.float64)
        if world_size <= 1:
            return np.zeros_like(b)
        return np.min([lat + per * b for lat, per in self.coefficients(world_size)], axis=0)

    def slopes(self, world_size: int) -> tuple[float, float]:
        """(smallest, largest) ms per byte over the algorithms: bounds of d time / d bytes."""
        if world_size <= 1:
            return 0.0, 0.0
        per = [p for _, p in self.coefficients(world_size)]
        return min(per), max(per)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "alpha_beta",
            "alpha_ms": self.alpha_ms,
            "beta_ms_per_byte": self.beta_ms_per_byte,
            "algorithms": list(self.algorithms),
        }


@dataclass(frozen=True)
class FittedComm:
    """A communication cost fitted directly as a function of bytes, independent of N.

    This is the original SeCoPa's form (``send``, ``gather``, ``bcast`` fitted per cluster for
    one world size); it does not extrapolate to other world sizes.
    """

    fn: CostFn

    def time(self, nbytes: ArrayLike, world_size: int) -> NDArray[np.float64]:
        b = np.asarray(nbytes, dtype=np.float64)
        if world_size <= 1:
            return np.zeros_like(b)
        return np.where(b > 0, self.fn(np.maximum(b, 1e-9)), 0.0)

    def slopes(self, world_size: int) -> tuple[float, float]:
        if world_size <= 1:
            return 0.0, 0.0
        return self.fn.slope_bounds()

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "fitted", "fn": self.fn.to_dict()}


@dataclass(frozen=True)
class MeasuredComm:
    """A collective measured at one world size: the measured times, interpolated linearly in
    bytes between the sampled sizes (the smallest size's time below them, the last segment's
    slope above them); at any other world size the alpha-beta ``model`` fitted to the same
    samples.

    An alpha-beta line fitted to a shaped link's samples can miss its own largest sample several
    times over (small messages ride the token bucket's burst; measured: a 100 Mbit/s all_to_all
    fitted at 79 ms where 692 ms was measured for 8 MiB), so at the measured world size the
    samples themselves are the better prediction. Times are made non-decreasing in size.
    """

    world_size: int
    sizes: tuple[float, ...]
    times_ms: tuple[float, ...]
    model: AlphaBeta

    def __post_init__(self) -> None:
        if len(self.sizes) < 2 or len(self.sizes) != len(self.times_ms):
            raise ProfileError("a measured collective needs at least two (size, time) samples")
        if any(b <= a for a, b in zip(self.sizes, self.sizes[1:], strict=False)):
            raise ProfileError("measured sizes must be increasing")

    def _curve(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        xs = np.asarray(self.sizes, dtype=np.float64)
        ts = np.maximum.accumulate(np.maximum(np.asarray(self.times_ms, dtype=np.float64), 0.0))
        return xs, ts

    def time(self, nbytes: ArrayLike, world_size: int) -> NDArray[np.float64]:
        b = np.asarray(nbytes, dtype=np.float64)
        if world_size <= 1:
            return np.zeros_like(b)
        if world_size != self.world_size:
            return self.model.time(b, world_size)
        xs, ts = self._curve()
        last = (ts[-1] - ts[-2]) / (xs[-1] - xs[-2])
        return np.where(b > xs[-1], ts[-1] + (b - xs[-1]) * last, np.interp(b, xs, ts))

    def slopes(self, world_size: int) -> tuple[float, float]:
        if world_size <= 1:
            return 0.0, 0.0
        if world_size != self.world_size:
            return self.model.slopes(world_size)
        xs, ts = self._curve()
        seg = np.diff(ts) / np.diff(xs)
        # per-byte cost, not latency: only segments from where the time has doubled over the
        # smallest message's. Below that the samples are latency and noise; made monotone, a
        # flat run there gave a slope of 0 (free bytes), and with it no compressed strategy
        # ever saved bandwidth on loopback (the planner's rule 2)
        keep = ts[:-1] >= 2.0 * ts[0]
        keep[-1] = True
        seg = seg[keep]
        return float(seg.min()), float(seg.max())

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "measured",
            "world_size": self.world_size,
            "sizes": list(self.sizes),
            "times_ms": list(self.times_ms),
            "model": self.model.to_dict(),
        }


CommOp = AlphaBeta | FittedComm | MeasuredComm


def comm_op_from_dict(d: Mapping[str, Any]) -> CommOp:
    """Rebuild a network op from its ``to_dict`` output."""
    kind = d.get("kind", "alpha_beta")
    if kind == "alpha_beta":
        return AlphaBeta(
            float(d["alpha_ms"]),
            float(d["beta_ms_per_byte"]),
            tuple(str(a) for a in d["algorithms"]),
        )
    if kind == "fitted":
        return FittedComm(costfn_from_dict(d["fn"]))
    if kind == "measured":
        model = comm_op_from_dict(d["model"])
        if not isinstance(model, AlphaBeta):
            raise ProfileError("a measured collective's model must be alpha_beta")
        return MeasuredComm(
            int(d["world_size"]),
            tuple(float(x) for x in d["sizes"]),
            tuple(float(t) for t in d["times_ms"]),
            model,
        )
    raise ProfileError(f"unknown network op kind {kind!r} (alpha_beta, fitted, measured)")


def link_network(
    bandwidth_bytes_per_s: float,
    latency_s: float,
    algorithms: Mapping[str, tuple[str, ...]] = CLUSTER_ALGORITHMS,
) -> dict[str, CommOp]:
    """Network ops of a cluster whose links all have this bandwidth and latency."""
    if not (bandwidth_bytes_per_s > 0 and latency_s >= 0):
        raise ProfileError("link bandwidth must be > 0 and latency >= 0")
    alpha, beta = latency_s * 1e3, 1e3 / bandwidth_bytes_per_s
    return {op: AlphaBeta(alpha, beta, tuple(algs)) for op, algs in algorithms.items()}
