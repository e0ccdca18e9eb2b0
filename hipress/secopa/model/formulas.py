"""The strategy tables the cost model evaluates (see :mod:`hipress.secopa.model.costmodel`).

A strategy is a :class:`Formula`: a table of :class:`Term` (an operation, how many times it
runs, on what size, as functions of the :class:`Dims` of one evaluation) and a combine rule.

- :data:`CASYNC_FORMULAS`: what CaSync runs (``hipress/casync/strategies/``), per partition,
  pipelined.
- :data:`ORIGINAL_FORMULAS`: the original SeCoPa's PS and Ring formulas
  (docs/explanation/secopa.md), whole-tensor sums.
- :func:`reduce_scatter_formulas`: FSDP2's gradient reduce-scatter of one unit, plain and as
  ``hipress.fsdp`` compresses it, whole-tensor sums.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from hipress.core.plan import Strategy
from hipress.secopa.model.profile import PayloadModel

Array = NDArray[np.float64]


@dataclass(frozen=True)
class Dims:
    """The shape of one evaluation: N workers, m elements, K partitions (an array)."""

    n: int
    m: float
    k: Array
    payload: PayloadModel

    @property
    def part(self) -> Array:
        """Elements per partition."""
        return self.m / self.k

    @property
    def shard(self) -> Array:
        """Elements per shard of a partition (PS splits each partition in N)."""
        return self.m / (self.k * self.n)

    def pay(self, elements: ArrayLike) -> Array:
        """Payload bytes of ``elements`` elements."""
        return self.payload.nbytes(elements)


@dataclass(frozen=True)
class Term:
    """``count`` runs of operation ``op`` on ``size`` (elements for compute, bytes for comm).

    ``pieces``: the runs cover pieces of one region of ``count * size`` elements (PS's and the
    ring's shards of a partition), so together they cost at least what one run over the whole
    region costs: a profile times small sizes with their data in cache, which shards of a
    large gradient are not (measured: dgc at 4 workers on 2 cores, 1.2 ns per element at 1M,
    3.1 at 4M; priced as hot, PS with 1M-element shards looked 2x cheaper than the allgather
    and ran 1.3x slower)."""

    op: str
    count: Callable[[Dims], ArrayLike]
    size: Callable[[Dims], ArrayLike]
    pieces: bool = False


@dataclass(frozen=True)
class Formula:
    """One synchronisation strategy (see the module docstring).

    Fields:
        name: unique within its table.
        compressed: whether the gradient is compressed.
        strategy: the CaSync strategy that runs it, or None if CaSync has no equivalent.
        compute: compute terms (ops in the profile's ``compute``).
        comm: communication terms (ops in the profile's ``network``).
        combine: ``"pipeline"`` (per-partition terms) or ``"sum"`` (whole-tensor terms).
        min_part: world size -> fewest elements a partition may have (PS: N, one per shard).
    """

    name: str
    compressed: bool
    strategy: Strategy | None
    compute: tuple[Term, ...]
    comm: tuple[Term, ...]
    combine: Literal["pipeline", "sum"] = "pipeline"
    min_part: Callable[[int], int] = field(default=lambda n: 1, repr=False)


def _one(d: Dims) -> float:
    return 1.0


def _n(d: Dims) -> float:
    return float(d.n)


def _n1(d: Dims) -> float:
    return float(d.n - 1)


CASYNC_FORMULAS: tuple[Formula, ...] = (
    Formula(
        "allreduce",
        compressed=False,
        strategy=Strategy.ALLREDUCE,
        compute=(),
        comm=(Term("allreduce", _one, lambda d: 4.0 * d.part),),
    ),
    Formula(
        "allgather",
        compressed=True,
        strategy=Strategy.ALLGATHER,
        compute=(
            Term("encode", _one, lambda d: d.part),
            Term("decode", _one, lambda d: d.part),  # N payloads averaged (decode_sum):
            Term("decode_more", _n1, lambda d: d.part),  # the others add to the first ...
            Term("average", _one, lambda d: d.part),  # ... and the sum is divided
            Term("check", _one, lambda d: d.part),  # CaSync's NaN/Inf check, if not in encode
        ),
        comm=(Term("all_gather", _one, lambda d: d.pay(d.part)),),
    ),
    Formula(
        "ps",
        compressed=True,
        strategy=Strategy.PS,
        compute=(
            Term("check", _n, lambda d: d.shard, pieces=True),  # NaN/Inf, if not in encode
            Term("encode", _n, lambda d: d.shard, pieces=True),  # N shards
            Term("decode", _one, lambda d: d.shard),  # N payloads of the shard I serve ...
            Term("decode_more", _n1, lambda d: d.shard),  # ... averaged (decode_sum)
            Term("average", _one, lambda d: d.shard),
            Term("encode", _one, lambda d: d.shard),  # re-encode the aggregate
            Term("decode", _n, lambda d: d.shard, pieces=True),  # all N aggregates
        ),
        comm=(
            Term("all_to_all", _one, lambda d: d.n * d.pay(d.shard)),
            Term("all_gather", _one, lambda d: d.pay(d.shard)),
        ),
        min_part=lambda n: n,
    ),
    Formula(
        "ring",
        compressed=True,
        strategy=Strategy.RING,
        compute=(
            Term("merge", _n, lambda d: d.shard, pieces=True),  # NaN/Inf check, one read
            Term("encode", _n, lambda d: d.shard, pieces=True),  # N-1 hops and the aggregate
            Term("decode", lambda d: 2.0 * d.n - 1, lambda d: d.shard, pieces=True),  # partials
            Term("merge", _n, lambda d: d.shard, pieces=True),  # N-1 adds of my shard, average
        ),
        # 2(N-1) dependent hops, each a send to the right while receiving from the left
        comm=(Term("send", lambda d: 2.0 * (d.n - 1), lambda d: d.pay(d.shard)),),
        min_part=lambda n: n,
    ),
)


def _r_elems(d: Dims) -> Array:
    """``r * m/K`` of the original: payload size of a partition in float32 elements."""
    return d.pay(d.part) / 4.0


ORIGINAL_FORMULAS: tuple[Formula, ...] = (
    Formula(
        "ps_plain",
        compressed=False,
        strategy=None,
        compute=(Term("merge", _n1, lambda d: d.part),),
        comm=(
            Term("gather", _one, lambda d: 4.0 * d.part),
            Term("bcast", _one, lambda d: 4.0 * d.part),
        ),
        combine="sum",
    ),
    Formula(
        "ps_compressed",
        compressed=True,
        strategy=Strategy.PS,
        compute=(
            Term("encode", lambda d: np.minimum(d.k + 1, d.n), lambda d: d.part),
            Term("decode", lambda d: np.minimum(d.n - 1 + d.k, 2 * (d.n - 1)), _r_elems),
            Term("merge", _n1, lambda d: d.part),
        ),
        comm=(
            Term("gather", _one, lambda d: d.pay(d.part)),
            Term("bcast", _one, lambda d: d.pay(d.part)),
        ),
        combine="sum",
    ),
    Formula(
        "ring_plain",
        compressed=False,
        strategy=Strategy.ALLREDUCE,
        compute=(Term("merge", _n1, lambda d: d.part),),
        comm=(Term("send", lambda d: 2.0 * (d.n - 1), lambda d: 4.0 * d.part),),
        combine="sum",
    ),
    Formula(
        "ring_compressed",
        compressed=True,
        strategy=None,
        compute=(
            Term("encode", _n, lambda d: d.part),
            Term("decode", _n, _r_elems),
            Term("merge", _n1, lambda d: d.part),
        ),
        comm=(Term("send", lambda d: 2.0 * (d.n - 1), lambda d: d.pay(d.part)),),
        combine="sum",
    ),
)


def reduce_scatter_formulas(
    grad_bytes: float = 4.0, trailer_bytes: float = 0.0
) -> tuple[Formula, ...]:
    """FSDP2's reduce-scatter of one unit's gradient, ``m`` (padded) elements of ``grad_bytes``
    bytes each (its reduce dtype) over N ranks, as two whole-tensor formulas (evaluate at K = 1):

    - ``"reduce_scatter"``: the plain collective on the ``grad_bytes * m`` bytes each rank holds
      (the ``reduce_scatter`` network op: measured, or a profile's ``all_to_all``, see
      :meth:`~hipress.secopa.model.profile.Profile.comm_op`) and the N-1 adds of the shard it keeps
      (``merge``);
    - ``"compressed_reduce_scatter"``: every rank checks and encodes the N shards of ``m/N``
      elements, one ``all_to_all`` sends the N payloads (each followed by ``trailer_bytes``),
      and every rank averages the N payloads of its shard (``decode_sum``: ``decode``, N-1
      ``decode_more``, ``average``). It needs a shard of at least one element per rank.

    Neither has a CaSync strategy (``strategy`` is None): they are for
    :meth:`~hipress.secopa.model.costmodel.CostModel.time`, not for DDP plans.
    """

    def shard_bytes(d: Dims) -> Array:
        return d.n * (d.pay(d.shard) + trailer_bytes)

    return (
        Formula(
            "reduce_scatter",
            compressed=False,
            strategy=None,
            compute=(Term("merge", _n1, lambda d: d.shard),),
            comm=(Term("reduce_scatter", _one, lambda d: grad_bytes * d.part),),
            combine="sum",
        ),
        Formula(
            "compressed_reduce_scatter",
            compressed=True,
            strategy=None,
            compute=(
                Term("check", _n, lambda d: d.shard, pieces=True),  # NaN/Inf, if not in encode
                Term("encode", _n, lambda d: d.shard, pieces=True),
                Term("decode", _one, lambda d: d.shard),
                Term("decode_more", _n1, lambda d: d.shard),
                Term("average", _one, lambda d: d.shard),
            ),
            comm=(Term("all_to_all", _one, shard_bytes),),
            combine="sum",
            min_part=lambda n: n,
        ),
    )
