"""The plan: per-parameter synchronisation decisions, shared by SeCoPa (producer), CaSync and
the Horovod wrapper (consumers).

A :class:`Plan` is immutable, JSON round-trippable and hashable (:meth:`Plan.digest`), so every
rank can prove it holds the same plan.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any


def _ms(ms: float) -> str:
    return f"{ms:.3f}" if ms < 100 else f"{ms:.1f}"


class PlanError(ValueError):
    """A plan is malformed or does not match the model it is applied to."""


MAX_PLAN_BYTES = 64 << 20


def _object(v: Any, what: str) -> dict[str, Any]:
    """A JSON object with string keys (``params``, ``totals``, ``meta``), as a dict."""
    if not isinstance(v, Mapping) or not all(isinstance(k, str) for k in v):
        raise PlanError(f"malformed plan: `{what}` must be an object with string keys")
    return dict(v)


def _count(v: Any, what: str, where: Mapping[str, Any]) -> int:
    """A whole count in a plan file: an integer >= 0 (not a bool, float or string)."""
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        name = where.get("name") if isinstance(where, Mapping) else None
        at = f" of entry {name!r}" if name is not None and what != "world_size" else ""
        raise PlanError(f"malformed plan: `{what}`{at} must be an integer >= 0, got {v!r}")
    return v


def _flag(v: Any, where: Mapping[str, Any]) -> bool:
    if not isinstance(v, bool):
        raise PlanError(
            f"malformed plan: `compress` of entry {where.get('name')!r} must be true or false, "
            f"got {v!r}"
        )
    return v


class Strategy(str, Enum):
    """How one tensor is synchronised (see docs/explanation/casync.md).

    ALLREDUCE: uncompressed allreduce (small tensors are batched into one bulk allreduce).
    ALLGATHER: every worker encodes, payloads are all-gathered, each worker decodes and sums N.
    PS: compressed scatter-reduce + all-gather (the original's PS with co-located servers): N
        shards, encode each, all_to_all, decode and merge own shard, re-encode, all-gather,
        decode.
    RING: compressed ring: N shards; in N-1 dependent hops each worker decodes the partial sum
        it receives from its left neighbour, adds its own shard, re-encodes and passes it on;
        the worker that ends with a shard's full sum averages and re-encodes it, and the N
        aggregates travel the ring compressed (N-1 more hops), decoded where they arrive.
    ROUNDS: the plan's multi-round algorithm (e.g. powersgd): each round's payload is
        all-reduced (summed), the next round's encode reads the sum, the decode the last.
    """

    ALLREDUCE = "allreduce"
    ALLGATHER = "allgather"
    PS = "ps"
    RING = "ring"
    ROUNDS = "rounds"


def gather_own(n: int, most: int, union: int) -> bool:
    """Whether an exact row-sparse step sends each rank's own rows, all-gathered (padded to
    ``most``, the largest count of the ``n`` ranks), rather than the ``union`` of their rows,
    allreduced: the all-gather puts ``(n - 1) * most`` rows on each rank's link, a ring
    allreduce ``2 (n - 1) / n * union``. Every rank decides alike, from the same counts."""
    return n * most < 2 * union


@dataclass(frozen=True)
class TensorPlan:
    """The decision for one parameter.

    Fields:
        name: parameter name (as in ``model.named_parameters()``).
        numel: element count.
        compress: whether the gradient is compressed.
        strategy: how it is synchronised; ALLREDUCE iff not compress.
        partitions: K >= 1, the number of pipelined partitions the tensor is split into.
        predicted_ms: the cost model's predicted sync time for this tensor alone.
        uncompressed_ms: the predicted time of the uncompressed alternative the decision was
            compared with (equal to ``predicted_ms`` when not compressed); 0 if unknown.
        rows: the tensor's row count, for a row-sparse entry (0: not given).
        row_bound: > 0 makes the entry row-sparse: only the rows holding a non-zero are sent
            (indices and values; ``compress``: values encoded with the algorithm, with error
            feedback per row), while no rank touches more than ``row_bound`` rows in a step;
            a denser step is synchronised densely. 0: dense, as ``strategy`` says.
    """

    name: str
    numel: int
    compress: bool
    strategy: Strategy
    partitions: int = 1
    predicted_ms: float = 0.0
    uncompressed_ms: float = 0.0
    rows: int = 0
    row_bound: int = 0

    def __post_init__(self) -> None:
        if self.partitions < 1:
            raise PlanError(f"{self.name}: partitions must be >= 1, got {self.partitions}")
        if self.row_bound and not (
            self.rows > 0 and self.numel % self.rows == 0 and self.row_bound <= self.rows
        ):
            raise PlanError(
                f"{self.name}: a row-sparse entry needs `rows` dividing its {self.numel} "
                f"elements and 0 < row_bound <= rows, got rows={self.rows}, "
                f"row_bound={self.row_bound}"
            )
        if self.row_bound and self.strategy not in (Strategy.ALLREDUCE, Strategy.ALLGATHER):
            raise PlanError(
                f"{self.name}: a row-sparse entry's strategy is allreduce (exact) or allgather "
                f"(compressed), got {self.strategy.value}"
            )
        if self.compress != (self.strategy is not Strategy.ALLREDUCE):
            raise PlanError(
                f"{self.name}: compress={self.compress} contradicts strategy {self.strategy.value}"
            )


@dataclass(frozen=True)
class Plan:
    """Decisions for every parameter of one model, for one algorithm and world size.

    Fields:
        algorithm: CompLL algorithm name.
        params: the algorithm's hyper-parameters.
        world_size: N the plan was made for.
        entries: one :class:`TensorPlan` per parameter.
        totals: predicted totals in ms (e.g. ``planned``, ``all_uncompressed``,
            ``all_compressed``), informational.
        meta: how the plan was made (planner settings, network source), informational;
            JSON-serialisable, not part of :meth:`digest`.

    ``str()`` is :meth:`table`; ``repr()`` is the dataclass's, every field.
    """

    algorithm: str
    params: Mapping[str, Any]
    world_size: int
    entries: tuple[TensorPlan, ...]
    totals: Mapping[str, float] = field(default_factory=dict)
    meta: Mapping[str, Any] = field(default_factory=dict)

    def lookup(self, name: str) -> TensorPlan:
        """Return the entry for parameter ``name``; raise :class:`PlanError` if absent."""
        for e in self.entries:
            if e.name == name:
                return e
        raise PlanError(f"plan has no entry for parameter {name!r}")

    def check_matches(self, named_numels: Iterable[tuple[str, int]]) -> None:
        """Raise :class:`PlanError` unless the plan covers exactly these (name, numel) pairs."""
        want = dict(named_numels)
        have = {e.name: e.numel for e in self.entries}
        missing = sorted(set(want) - set(have))
        extra = sorted(set(have) - set(want))
        wrong = sorted(k for k in set(want) & set(have) if want[k] != have[k])
        problems = []
        if missing:
            problems.append(f"missing parameters {missing[:5]}")
        if extra:
            problems.append(f"unknown parameters {extra[:5]}")
        if wrong:
            problems.append(
                "size mismatch for "
                + ", ".join(f"{k} (plan {have[k]}, model {want[k]})" for k in wrong[:5])
            )
        if problems:
            raise PlanError("plan does not match the model: " + "; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["params"] = dict(self.params)
        d["totals"] = dict(self.totals)
        d["meta"] = dict(self.meta)
        for e in d["entries"]:
            e["strategy"] = e["strategy"].value
            if not e["row_bound"]:  # (dense entries are written as before)
                del e["rows"], e["row_bound"]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Plan:
        if not isinstance(d, Mapping) or not isinstance(d.get("entries"), (list, tuple)):
            raise PlanError("malformed plan: not an object with a list of `entries`")
        try:
            entries = tuple(
                TensorPlan(
                    name=str(e["name"]),
                    numel=_count(e["numel"], "numel", e),
                    compress=_flag(e["compress"], e),
                    strategy=Strategy(e["strategy"]),
                    partitions=_count(e.get("partitions", 1), "partitions", e),
                    predicted_ms=float(e.get("predicted_ms", 0.0)),
                    uncompressed_ms=float(e.get("uncompressed_ms", 0.0)),
                    rows=_count(e.get("rows", 0), "rows", e),
                    row_bound=_count(e.get("row_bound", 0), "row_bound", e),
                )
                for e in d["entries"]
            )
            return cls(
                algorithm=str(d["algorithm"]),
                params=_object(d.get("params", {}), "params"),
                world_size=_count(d["world_size"], "world_size", d),
                entries=entries,
                totals={k: float(v) for k, v in _object(d.get("totals", {}), "totals").items()},
                meta=_object(d.get("meta", {}), "meta"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, PlanError):
                raise
            raise PlanError(f"malformed plan: {exc}") from None

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        if len(text) > MAX_PLAN_BYTES:
            raise PlanError(f"a plan file has at most {MAX_PLAN_BYTES >> 20} MiB")
        try:
            data = json.loads(text)
        except ValueError as exc:  # bad JSON, or json's own limits (an integer of 4300+ digits)
            raise PlanError(f"plan is not valid JSON: {exc}") from None
        except RecursionError:
            raise PlanError("plan is not a plan: its JSON is nested too deeply") from None
        return cls.from_dict(data)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        try:
            text = Path(path).read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            raise PlanError(f"plan {path} is not a text (UTF-8 JSON) file") from None
        return cls.from_json(text)

    def table(self, heading: bool = True) -> str:
        """A fixed-width table of the decisions, one line per parameter (with its predicted
        times in ms where the plan has any), after a heading line (``heading``) that names the
        algorithm, the world size and how many tensors are compressed."""
        rows = [("parameter", "elements", "decision", "strategy", "K", "pred ms", "plain ms")]
        for e in self.entries:
            decision = ("compress" if e.compress else "plain") + (
                f" as rows (<= {e.row_bound})" if e.row_bound else "")  # fmt: skip
            rows.append((e.name, f"{e.numel:,}", decision,
                         e.strategy.value, str(e.partitions), _ms(e.predicted_ms),
                         _ms(e.uncompressed_ms)))  # fmt: skip
        if not any(e.predicted_ms or e.uncompressed_ms for e in self.entries):
            rows = [r[:5] for r in rows]  # a plan without predictions (the default rule's)
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = []
        for r in rows:
            cells = [c.ljust(w) if i in (0, 2, 3) else c.rjust(w)
                     for i, (c, w) in enumerate(zip(r, widths, strict=True))]  # fmt: skip
            lines.append("  ".join(cells).rstrip())
        if heading:
            n = sum(e.compress for e in self.entries)
            params = f" {dict(self.params)}" if self.params else ""
            lines.insert(0, f"plan for {self.algorithm}{params}, {self.world_size} workers: "
                            f"{n} of {len(self.entries)} tensors compressed")  # fmt: skip
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def digest(self) -> str:
        """A content hash of the decisions (not of predictions), equal on every rank."""
        key = [self.algorithm, sorted(dict(self.params).items()), self.world_size]
        key += [(e.name, e.numel, e.compress, e.strategy.value, e.partitions)
                + ((e.rows, e.row_bound) if e.row_bound else ())
                for e in self.entries]  # fmt: skip
        return hashlib.sha256(repr(key).encode()).hexdigest()[:16]
