"""The network's floor under a step: how much communication no schedule can hide.

Backward produces gradients in an order, the last ones (an LM's input embedding) at its very
end. Whatever a gradient's bytes take on the link can only start once it exists, so for every
``tau``, the bytes of the gradients ready in the last ``tau`` ms of backward need at least
``bytes / rate`` of link time from then on, of which at most ``tau`` hides behind backward::

    exposed >= max over tau of (sum of bytes ready within tau of the end) / rate - tau

whatever the bucketing, partitioning or overlap (encode, decode and latency only add to it).
A multi-round algorithm (PowerSGD) sends each of its rounds as an all-reduce: its bytes count
from the gradient's ready time too. The rounds of one tensor do not overlap each other (a round's
encode needs the sum of the round before), but they do overlap the backward of the gradients
still to come; the floor counts their bytes only, so the sequencing inside a tensor (a latency
and an encode between rounds) only adds to it and the bound stays a bound.
:func:`exposed_floor_ms` computes it from :class:`ReadyClock`'s measurements (each gradient's
lead over the end of backward, in a compute-only run where nothing delays backward; the clock is
SeCoPa's, :mod:`hipress.secopa.measure.readiness`) and the bytes each rank sends per gradient
(:func:`bytes_sent`); ``efficiency_bound = compute / (compute + floor)`` is the best scaling
efficiency any schedule of that traffic reaches on that link.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hipress.core.layout import layout_tensor
from hipress.core.plan import Strategy, TensorPlan, gather_own
from hipress.secopa.measure.readiness import ReadyClock
from hipress.secopa.model.ddpbuckets import ready_buckets
from hipress.secopa.model.network import ALGORITHMS

__all__ = [
    "ReadyClock", "allreduce_bytes", "bucket_leads", "bytes_sent", "exposed_floor_ms",
    "row_bytes_sent",
]  # fmt: skip


def _sent(algorithm: str, nbytes: float, world_size: int) -> float:
    """Bytes each rank sends in collective ``algorithm`` of SeCoPa's network model
    (:data:`hipress.secopa.model.network.ALGORITHMS`: its bandwidth factor) of per-rank size
    ``nbytes``."""
    return ALGORITHMS[algorithm](world_size)[1] * nbytes


def allreduce_bytes(nbytes: float, world_size: int) -> float:
    """Bytes each rank sends in a bandwidth-optimal allreduce of ``nbytes``."""
    return _sent("ring_allreduce", nbytes, world_size)


def bytes_sent(
    entries: Sequence[Sequence[Any]],
    payload_nbytes: Any,
    world_size: int,
    round_bytes: Mapping[str, Sequence[int]] | None = None,
) -> dict[str, float]:
    """Bytes one rank sends per step for each tensor of a hipress plan, given as
    ``[name, numel, compress, strategy, partitions]`` rows (``hipress bench e2e``'s ``plan``),
    optionally followed by ``rows, row_bound, union`` (a row-sparse entry,
    :func:`row_bytes_sent`): the all-gather sends a rank's payload to each of the N-1 others;
    PS and the ring send N-1 shard payloads twice (scatter-reduce, then all-gather);
    uncompressed tensors an fp32 allreduce's share; a multi-round entry (strategy ``rounds``)
    an allreduce's share of each of its rounds' payloads (``round_bytes[name]``)."""
    out: dict[str, float] = {}
    for name, numel, compress, strategy, parts, *more in entries:
        rows, bound, union = [*more, 0, 0, None][:3]
        if strategy == Strategy.ROUNDS.value:
            if round_bytes is None or name not in round_bytes:
                raise ValueError(f"{name}: a rounds entry needs its rounds' payload bytes")
            out[name] = sum(allreduce_bytes(float(b), world_size) for b in round_bytes[name])
            continue
        if bound:
            out[name] = row_bytes_sent(numel, rows, bound, union, compress, payload_nbytes,
                                       world_size)  # fmt: skip
            continue
        if not compress:
            out[name] = allreduce_bytes(4.0 * numel, world_size)
            continue
        entry = TensorPlan(name, numel, compress=True, strategy=Strategy(strategy),
                           partitions=parts)  # fmt: skip
        total = 0.0
        for c in layout_tensor(entry, world_size, payload_nbytes):
            if c.strategy is Strategy.ALLGATHER:
                total += _sent("ring_allgather", c.payloads[0], world_size)
            else:  # all_to_all of the N shard payloads, all-gather of this rank's shard
                shards = sum(c.payloads)
                total += _sent("pairwise_alltoall", shards, world_size)
                total += _sent("ring_allgather", shards / world_size, world_size)
        out[name] = total
    return out


def row_bytes_sent(
    numel: int,
    rows: int,
    bound: int,
    union: int | None,
    compress: bool,
    payload_nbytes: Any,
    world_size: int,
) -> float:
    """Bytes one rank sends per step for a row-sparse tensor (CaSync's
    :mod:`~hipress.casync.strategies.rowsparse`): the all-gather of ``bound + 1`` int64 (count
    and indices), then the ``union`` rows every rank holds: an fp32 allreduce's share or, where
    CaSync sends fewer bytes so, each rank's own rows all-gathered (taken at the count the
    bound was set for), or (``compress``) the all-gather of their payload. ``union`` is the
    rows of a step's summed gradient that are not zero (measured); None takes the most the
    bound allows a step that stays sparse, ``min(rows, N * (bound - 1) / 2)`` (the bound is
    twice the count plus one)."""
    most = min(rows, (bound - 1) // 2)  # the count the bound was set for
    if union is None:
        union = min(rows, world_size * most)
    k = union * (numel // rows)
    sent = _sent("ring_allgather", 8.0 * (bound + 1), world_size)
    if compress:
        return sent + (_sent("ring_allgather", payload_nbytes(k), world_size) if k else 0.0)
    if gather_own(world_size, most, union):  # each rank's own rows, all-gathered
        return sent + _sent("ring_allgather", 4.0 * most * (numel // rows), world_size)
    return sent + allreduce_bytes(4.0 * k, world_size)


def exposed_floor_ms(
    leads: Mapping[str, float], sent: Mapping[str, float], rate_mbit: float
) -> float:
    """The least communication time exposed after backward (module docstring): ``leads`` (ms
    each gradient is ready before backward ends), ``sent`` (bytes per rank per tensor), the link
    rate in Mbit/s. Tensors missing from ``leads`` count as ready at the end."""
    per_ms = rate_mbit * 1e3 / 8  # bytes per ms
    floor = acc = 0.0
    for name in sorted(sent, key=lambda n: leads.get(n, 0.0)):
        acc += sent[name]
        floor = max(floor, acc / per_ms - leads.get(name, 0.0))
    return floor


def bucket_leads(
    leads: Mapping[str, float], numels: Mapping[str, int], cap_mb: float, first_mb: float
) -> dict[str, float]:
    """Each gradient's lead once DDP's buckets hold it back: DDP hands a bucket to the hook
    when its last gradient is ready, so every member of a bucket leaves with the lead of the
    one ready last (the buckets DDP rebuilds in ready order at these caps,
    :func:`~hipress.secopa.model.ddpbuckets.ready_buckets`). :func:`exposed_floor_ms` over
    these leads is the floor under that bucketing (``bucket_floor_ms`` in bench e2e)."""
    names = list(numels)
    lead = [leads.get(n, 0.0) for n in names]
    out = {}
    for b in ready_buckets([numels[n] for n in names], lead, cap_mb, first_mb):
        least = min(lead[i] for i in b)
        out.update({names[i]: least for i in b})
    return out
