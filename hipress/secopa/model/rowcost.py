"""The price of synchronising a 2-D gradient as its non-zero rows (a row-sparse entry).

CaSync's row-sparse strategy (:mod:`hipress.casync.strategies.rowsparse`) runs one such tensor
in two collectives: every rank all-gathers a block of ``row_bound + 1`` int64 (its count of
touched rows, then their indices), then the rows of the union ``U`` of all ranks' rows travel:
allreduced as float32 (exact), or encoded with the algorithm and all-gathered (compressed).
Priced with the profile's own costs (:class:`RowPrice`):

- link: ``all_gather(8 * (row_bound + 1))`` plus, exact, ``all_gather(4 * touched * width)``
  (each rank's own rows) or ``allreduce(4 * |U| * width)``, whichever CaSync would send
  (:func:`~hipress.core.plan.gather_own`), or, compressed, ``all_gather(payload(|U| *
  width))``, each with CaSync's cost per call;
- compute: one read pass over the whole gradient to find its touched rows, the gather of the
  ``|U|`` rows, and the scatter of the result into the gradient (each a ``merge``-like pass over
  the elements it touches); exact rows all-gathered also the sum of the N ranks' rows;
  compressed also the encode of the rows, the decode of the N payloads (``decode_sum``) and one
  more decode for the rows' error feedback.

``|U|`` is taken at its largest, ``min(rows, N * touched)`` (no two ranks touch the same row),
where exact rows travel all-gathered unless they fill most of the table. ``row_bound`` is
``ceil(slack * touched) + 1`` as :func:`hipress.casync.rowprobe.plan_rows` sets it.

:func:`breakeven` is the most rows one rank may touch in a step for the rows to stay cheaper
than a given dense time (the price grows with the count, so the answer is one number): what a
plan made before any step has been seen (``plan="auto"``) records, for CaSync to decide by once
it has counted the rows.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from hipress.core.plan import PlanError, gather_own
from hipress.core.rule import Selection
from hipress.secopa.model.costmodel import CostModel, Member

__all__ = [
    "RowDensity", "RowPrice", "breakeven", "choose_rows", "declared_rows", "price_rows", "row_bound",
]  # fmt: skip

log = logging.getLogger(__name__)

INDEX_BYTES = 8  # int64 row indices


def row_bound(touched: int, rows: int, slack: float = 2.0) -> int:
    """The bound of a row-sparse entry whose ranks touch at most ``touched`` rows a step."""
    return min(rows, math.ceil(slack * touched) + 1)


@dataclass(frozen=True)
class RowPrice:
    """The predicted cost of one row-sparse tensor in one step.

    Fields:
        rows, width: the gradient's shape.
        touched: the most rows one rank touches in a step.
        bound: the entry's ``row_bound``.
        union: the rows that travel (``min(rows, N * touched)``).
        compressed: whether the rows' values are compressed.
        compute_ms: the scan, gather and scatter (and encode/decode) on one rank.
        comm_ms: both collectives, latency and CaSync's cost per call included.
        bytes: bytes one rank puts on the link for it (a ring all-gather and allreduce).
    """

    rows: int
    width: int
    touched: int
    bound: int
    union: int
    compressed: bool
    compute_ms: float
    comm_ms: float
    bytes: float

    @property
    def ms(self) -> float:
        """Predicted ms: compute, then the link (the two collectives depend on each other)."""
        return self.compute_ms + self.comm_ms

    def to_dict(self) -> dict[str, float | int | bool]:
        return {"rows": self.rows, "touched": self.touched, "row_bound": self.bound,
                "union": self.union, "compressed": self.compressed,
                "compute_ms": round(self.compute_ms, 6), "comm_ms": round(self.comm_ms, 6),
                "ms": round(self.ms, 6), "bytes": round(self.bytes, 1)}  # fmt: skip


def _scalar(x: object) -> float:
    return float(np.asarray(x, dtype=np.float64).reshape(-1)[0])


def price_rows(
    model: CostModel,
    numel: int,
    rows: int,
    touched: int,
    compressed: bool,
    slack: float = 2.0,
) -> RowPrice:
    """The :class:`RowPrice` of a ``rows x numel/rows`` gradient whose ranks each touch at
    most ``touched`` rows a step, at ``model``'s world size. Raises ValueError when ``rows``
    does not divide ``numel`` or ``touched`` is not in ``0..rows``."""
    if rows < 1 or numel % rows:
        raise ValueError(f"{rows} rows do not divide {numel} elements")
    if not 0 <= touched <= rows:
        raise ValueError(f"touched rows must be in 0..{rows}, got {touched}")
    p, n, width = model.profile, model.n, numel // rows
    bound = row_bound(touched, rows, slack)
    union = min(rows, n * touched)
    k = union * width  # elements that travel
    call = p.call_ms
    index_bytes = INDEX_BYTES * (bound + 1)
    comm = _scalar(p.comm_op("all_gather").time(index_bytes, n)) + call
    compute = _scalar(p.compute_ms("merge", numel))  # the scan for touched rows
    compute += 2 * _scalar(p.compute_ms("merge", k))  # gather the union's rows, scatter back
    sent = (n - 1) * index_bytes  # (a ring all-gather sends N-1 blocks)
    if k:
        if compressed:
            pay = _scalar(p.payload.nbytes(k))
            comm += _scalar(p.comm_op("all_gather").time(pay, n)) + call
            compute += _scalar(p.compute_ms("encode", k) + 2 * p.compute_ms("decode", k))
            compute += _scalar(
                (n - 1) * p.compute_ms("decode_more", k) + p.compute_ms("average", k)
            )
            sent += (n - 1) * pay
        elif gather_own(n, touched, union):  # each rank's own rows, all-gathered, summed
            own = 4.0 * touched * width
            comm += _scalar(p.comm_op("all_gather").time(own, n)) + call
            compute += _scalar(p.compute_ms("merge", n * touched * width))
            sent += (n - 1) * own
        else:
            comm += _scalar(p.comm_op("allreduce").time(4.0 * k, n)) + call
            sent += 2.0 * (n - 1) / n * 4.0 * k  # (a ring allreduce's share)
    return RowPrice(rows, width, touched, bound, union, compressed, compute, comm, sent)


def breakeven(
    model: CostModel,
    numel: int,
    rows: int,
    dense_ms: float,
    compressed: bool,
    slack: float = 2.0,
) -> int:
    """The most rows one rank may touch in a step with the rows' price still strictly below
    ``dense_ms``; -1 when even a step with no touched row is not cheaper."""
    if not price_rows(model, numel, rows, 0, compressed, slack).ms < dense_ms:
        return -1
    lo, hi = 0, rows  # price(lo) < dense_ms; find the largest such count (price is monotone)
    if price_rows(model, numel, rows, hi, compressed, slack).ms < dense_ms:
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if price_rows(model, numel, rows, mid, compressed, slack).ms < dense_ms:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True)
class RowDensity:
    """What the planner knows of one 2-D gradient's rows.

    Fields:
        rows: its row count (dividing its element count).
        touched: the most rows one rank touches in a step (measured, e.g. with
            :func:`hipress.casync.rowsparse.touched_rows`, or declared); None: not known yet,
            the plan then records only the break-even count.
        exact: price lossless rows against a plain allreduce (the tensor is kept plain, as
            the default rule and ``plan="auto"`` keep embeddings); else rows in the mode the
            plan chose for the tensor (compressed rows against its compressed time).
    """

    rows: int
    touched: int | None = None
    exact: bool = False


def choose_rows(
    model: CostModel,
    names: Sequence[str],
    members: Sequence[Member],
    densities: Mapping[str, RowDensity],
    plain: str,
    gather: str,
    slack: float = 2.0,
) -> tuple[list[Member], dict[str, dict[str, object]]]:
    """``members`` (one per parameter) with each tensor of ``densities`` synchronised as rows
    where their price is strictly below its dense time alone (a member with ``fixed`` cost,
    formula ``gather`` when compressed, ``plain`` when exact), and a record per such tensor:
    its break-even count, dense and row prices and what was chosen. ``plain``/``gather``
    name the table's uncompressed allreduce and compressed all-gather formulas. Raises
    :class:`PlanError` naming a tensor that is not a parameter or whose rows do not fit."""
    index = {n: i for i, n in enumerate(names)}
    out, record = list(members), {}
    for name in sorted(densities):
        d = densities[name]
        if name not in index:
            raise PlanError(f"row density given for {name!r}, which is not a parameter")
        m = members[index[name]]
        if d.rows < 1 or m.numel % d.rows or not (d.touched is None or 0 <= d.touched <= d.rows):
            raise PlanError(f"{name}: {d.rows} rows (touched {d.touched}) do not fit its "
                            f"{m.numel} elements; rows must divide them and 0 <= touched <= rows")  # fmt: skip
        compressed = model.formula(m.formula).compressed and not d.exact
        dense = model.time(m.formula, m.numel, m.k) if compressed else model.time(plain, m.numel)
        rec: dict[str, object] = {
            "rows": d.rows, "compressed": compressed, "dense_ms": round(dense, 6),
            "breakeven": breakeven(model, m.numel, d.rows, dense, compressed, slack),
        }  # fmt: skip
        record[name] = rec
        if d.touched is None:
            rec["chosen"] = "rows if at most breakeven rows are touched"
            continue
        price = price_rows(model, m.numel, d.rows, d.touched, compressed, slack)
        rec.update(price.to_dict())
        win = price.ms < dense
        rec["chosen"] = "rows" if win else "dense"
        log.info("plan: %s: %d of %d rows touched a step: rows %.3f ms vs dense %.3f ms: %s",
                 name, d.touched, d.rows, price.ms, dense, rec["chosen"])  # fmt: skip
        if win:
            fixed = (price.compute_ms, price.comm_ms)
            out[index[name]] = Member(gather if compressed else plain, m.numel, 1, fixed)
    return out, record


def declared_rows(
    params: Sequence[tuple[str, tuple[int, ...]]], selection: Selection, density: float
) -> dict[str, RowDensity]:
    """The :class:`RowDensity` of each 2-D embedding of ``params`` (``(name, shape)``; an
    embedding as ``selection`` judges one) when one rank's step touches ``density`` of its
    rows (rounded up): exact rows for those ``selection`` keeps plain. Raises
    :class:`PlanError` unless ``0 <= density <= 1`` and there is such an embedding."""
    if not 0.0 <= density <= 1.0:
        raise PlanError(f"a row density is a fraction of the rows, 0 to 1, got {density}")
    emb = [(n, s) for n, s in params if len(s) == 2 and s[0] > 0 and selection.is_embedding(n, s)]
    if not emb:
        raise PlanError("a row density needs an embedding (an nn.Embedding's weight, or by "
                        "name: *emb*.weight, wte, wpe); the model has none")  # fmt: skip
    plain = selection.reasons(emb)
    return {n: RowDensity(s[0], math.ceil(density * s[0]), exact=n in plain) for n, s in emb}
