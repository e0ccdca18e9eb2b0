"""A profile: everything the cost model needs to know about one algorithm on one cluster.

A :class:`Profile` holds

- the algorithm's payload size model (:class:`PayloadModel`, bytes for n elements),
- compute costs in ms as functions of the element count: ``encode``, ``decode`` (n decoded
  elements), ``merge`` (``out += x`` of n float32) and optionally ``decode_acc`` (decode adding
  into the output) and ``decode_sum2`` (the average of two payloads, as CaSync averages),
- network costs: one :class:`CommOp` per collective (alpha-beta with the collective's
  algorithm, so it extrapolates to any world size), and
- ``overlap`` in [0, 1]: how much computation hides behind communication when partitions are
  pipelined (1 = perfectly, 0 = not at all), and
- the host's calibration (:mod:`hipress.secopa.measure.calibrate`): ``compute_scale``, how much slower
  encode and decode run inside a sync step than timed alone (they share the cores with
  collectives and the other threads), measured per probe size where the model has tensors of
  very different sizes (``compute_scale_by_size``), and ``call_ms``, a fixed cost per
  collective CaSync issues beyond the collective itself (the hook's Python, thread hand-offs).
  1 and 0 when not measured.
- optionally, when each gradient is ready in backward (:class:`~hipress.secopa.model.readiness.
  Readiness`, measured by :mod:`hipress.secopa.measure.readiness`): with it the planner judges a
  plan by the exposed time of the whole step (:mod:`~hipress.secopa.model.exposure`), without
  it (profiles written before it existed, or measured without a training step) by the sum of
  per-tensor costs.

Profiles are immutable and JSON round-trippable. The profilers measure them (compute:
:mod:`hipress.secopa.measure.profiler`, network: :mod:`hipress.secopa.measure.netprofiler`);
:meth:`Profile.with_link` replaces the network part by a user-given link, which plans for a
cluster that is not here, at any world size, without running anything.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from hipress.secopa.model.costfn import CostFn, CostFnError, costfn_from_dict
from hipress.secopa.model.network import (
    ALGORITHMS,
    CLUSTER_ALGORITHMS,
    GLOO_ALGORITHMS,
    AlphaBeta,
    CommOp,
    FittedComm,
    MeasuredComm,
    ProfileError,
    comm_op_from_dict,
    link_network,
)
from hipress.secopa.model.readiness import Readiness

__all__ = [
    "ALGORITHMS",
    "CLUSTER_ALGORITHMS",
    "COLLECTIVES",
    "COMPUTE_OPS",
    "GLOO_ALGORITHMS",
    "AlphaBeta",
    "CommOp",
    "FittedComm",
    "MeasuredComm",
    "PayloadModel",
    "Profile",
    "ProfileError",
    "Readiness",
    "affine_profile",
    "comm_op_from_dict",
    "link_network",
]

PROFILE_VERSION = 1
COMPUTE_OPS = ("encode", "decode", "merge")
# ops computed from the measured ones (see Profile.compute_ms)
_DERIVED = ("decode_acc", "decode_more", "average", "check")
COLLECTIVES = ("allreduce", "all_gather", "all_to_all", "broadcast")
# network ops priced by a measured one when a profile does not hold them: a ring reduce-scatter
# of B bytes per rank sends N-1 blocks of B/N in N-1 steps, as the pairwise all_to_all of a
# B-byte send buffer does (its adds are compute, a formula's ``merge`` terms)
_DERIVED_COMM = {"reduce_scatter": "all_to_all"}


@dataclass(frozen=True)
class PayloadModel:
    """Payload bytes of n elements: ``bytes_per_element * n + header`` (continuous).

    The real ``payload_nbytes`` rounds up to 8 bytes; the model is its least-squares line, off
    by at most a few bytes, and smooth so the planner's decisions are smooth in size.
    """

    bytes_per_element: float
    header: float = 0.0

    def __post_init__(self) -> None:
        if not (self.bytes_per_element > 0 and self.header >= 0):
            raise ProfileError(f"payload model needs bytes_per_element > 0, header >= 0: {self}")

    def nbytes(self, n: ArrayLike) -> NDArray[np.float64]:
        return self.bytes_per_element * np.asarray(n, dtype=np.float64) + self.header

    def ratio(self, n: float) -> float:
        """Compression ratio r(n) = payload bytes / (4 n)."""
        return float(self.nbytes(n)) / (4.0 * n)


@dataclass(frozen=True)
class Profile:
    """Costs of one algorithm on one cluster (see the module docstring).

    Fields:
        algorithm: CompLL algorithm name (or a codec name such as ``fp16``).
        params: its hyper-parameters.
        payload: payload size model.
        compute: ``encode``, ``decode``, ``merge`` (and optionally ``decode_acc``,
            ``decode_sum2``) -> cost in ms of n elements.
        network: op name -> :class:`CommOp`; at least the four CaSync collectives.
        overlap: fraction of the shorter of compute/communication hidden by pipelining.
        compute_scale: every compute cost is multiplied by this (in-step slowdown, > 0).
        compute_scale_by_size: ``(elements, scale)`` pairs measured at increasing probe sizes;
            where given, they replace ``compute_scale``: an op on n elements is scaled by
            their interpolation in log(n), the nearest one's outside them.
        call_ms: added to every collective call of CaSync's strategies (ms, >= 0).
        encode_checks_finite: the encode reports NaN/Inf in its gradient from its own pass
            (``encode_checked``), so CaSync's allgather and PS read no chunk for it: the
            ``check`` op then costs nothing (else a ``merge``: one read pass).
        meta: provenance (host, backend, measured world size, fit errors); informational.
        readiness: when each gradient is ready in backward (None: not measured).
    """

    algorithm: str
    params: Mapping[str, Any]
    payload: PayloadModel
    compute: Mapping[str, CostFn]
    network: Mapping[str, CommOp]
    overlap: float = 1.0
    meta: Mapping[str, Any] = field(default_factory=dict)
    compute_scale: float = 1.0
    call_ms: float = 0.0
    compute_scale_by_size: tuple[tuple[float, float], ...] = ()
    encode_checks_finite: bool = False
    readiness: Readiness | None = None

    def __post_init__(self) -> None:
        missing = [op for op in COMPUTE_OPS if op not in self.compute]
        missing += [op for op in COLLECTIVES if op not in self.network]
        if missing:
            raise ProfileError(f"profile lacks costs for {missing}")
        if not 0.0 <= self.overlap <= 1.0:
            raise ProfileError(f"overlap must be in [0, 1], got {self.overlap}")
        if not (np.isfinite(self.compute_scale) and self.compute_scale > 0):
            raise ProfileError(f"compute_scale must be finite and > 0, got {self.compute_scale}")
        if not (np.isfinite(self.call_ms) and self.call_ms >= 0):
            raise ProfileError(f"call_ms must be finite and >= 0, got {self.call_ms}")
        pts = self.compute_scale_by_size
        bad = any(not (np.isfinite(s) and s > 0 and np.isfinite(x) and x >= 1) for x, s in pts)
        if bad or any(b[0] <= a[0] for a, b in itertools.pairwise(pts)):
            raise ProfileError(
                "compute_scale_by_size must be (elements >= 1, scale > 0) pairs at increasing "
                f"sizes, got {list(pts)}"
            )

    def scale_at(self, n: ArrayLike) -> NDArray[np.float64]:
        """The in-step compute scale for ops on ``n`` elements (see ``compute_scale_by_size``)."""
        x = np.asarray(n, dtype=np.float64)
        pts = self.compute_scale_by_size
        if not pts:
            return np.full_like(x, self.compute_scale)
        xs = np.log(np.array([p[0] for p in pts], dtype=np.float64))
        ss = np.array([p[1] for p in pts], dtype=np.float64)
        return np.interp(np.log(np.maximum(x, 1.0)), xs, ss)

    def has_compute(self, op: str) -> bool:
        """Whether :meth:`compute_ms` knows ``op`` (derived ops fall back, see there)."""
        return op in self.compute or (op in _DERIVED and "decode" in self.compute)

    def compute_ms(self, op: str, n: ArrayLike) -> NDArray[np.float64]:
        """Cost in ms of compute op ``op`` on ``n`` elements (0 for n == 0).

        Derived ops: ``decode_acc`` (decode adding into the output) falls back to ``decode +
        merge`` when the profile does not hold it. Averaging N payloads as CaSync does
        (``decode_sum``) costs ``decode + (N - 1) * decode_more + average``: with a measured
        ``decode_sum2`` (two payloads averaged), ``decode_more`` is ``decode_sum2 - decode``
        (floored at 0; the division is inside it) and ``average`` is 0; without it (older
        profiles), ``decode_acc`` and one ``merge``.
        """
        x = np.asarray(n, dtype=np.float64)
        if op == "check" and op not in self.compute:  # CaSync's NaN/Inf check of a chunk
            return np.zeros_like(x) if self.encode_checks_finite else self.compute_ms("merge", x)
        if op == "decode_acc" and op not in self.compute:
            return self.compute_ms("decode", x) + self.compute_ms("merge", x)
        if op in ("decode_more", "average"):
            fused = "decode_sum2" in self.compute
            if op == "average":
                return np.zeros_like(x) if fused else self.compute_ms("merge", x)
            if not fused:
                return self.compute_ms("decode_acc", x)
            more = self.compute_ms("decode_sum2", x) - self.compute_ms("decode", x)
            return np.maximum(more, 0.0)
        if op not in self.compute:
            raise ProfileError(f"profile has no compute cost {op!r} (has {sorted(self.compute)})")
        ms = self.compute[op](np.maximum(x, 1e-9)) * self.scale_at(x)
        return np.where(x > 0, ms, 0.0)

    def comm_op(self, op: str) -> CommOp:
        """The cost of network op ``op``; ``reduce_scatter``, where the profile holds none, is
        its ``all_to_all`` (the same steps and bytes). Raises :class:`ProfileError`."""
        if op not in self.network and op in _DERIVED_COMM:
            op = _DERIVED_COMM[op]
        if op not in self.network:
            raise ProfileError(f"profile has no network cost {op!r} (has {sorted(self.network)})")
        return self.network[op]

    def with_link(
        self,
        bandwidth_bytes_per_s: float,
        latency_s: float,
        algorithms: Mapping[str, tuple[str, ...]] = CLUSTER_ALGORITHMS,
        overlap: float | None = None,
    ) -> Profile:
        """A copy whose network is a user-given link (keeps compute and payload)."""
        meta = dict(self.meta)
        meta["network_source"] = {
            "kind": "link",
            "bandwidth_bytes_per_s": bandwidth_bytes_per_s,
            "latency_s": latency_s,
        }
        return replace(
            self,
            network=link_network(bandwidth_bytes_per_s, latency_s, algorithms),
            overlap=self.overlap if overlap is None else overlap,
            meta=meta,
        )

    def with_readiness(self, readiness: Readiness | None) -> Profile:
        """A copy that holds these gradient ready times (None: drops them)."""
        return replace(self, readiness=readiness)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; ``readiness`` appears only when measured, so a profile without it
        writes what older versions wrote."""
        d: dict[str, Any] = {
            "version": PROFILE_VERSION,
            "algorithm": self.algorithm,
            "params": dict(self.params),
            "payload": {
                "bytes_per_element": self.payload.bytes_per_element,
                "header": self.payload.header,
            },
            "compute": {k: v.to_dict() for k, v in sorted(self.compute.items())},
            "network": {k: v.to_dict() for k, v in sorted(self.network.items())},
            "overlap": self.overlap,
            "compute_scale": self.compute_scale,
            "compute_scale_by_size": [list(p) for p in self.compute_scale_by_size],
            "encode_checks_finite": self.encode_checks_finite,
            "call_ms": self.call_ms,
            "meta": dict(self.meta),
        }
        if self.readiness is not None:
            d["readiness"] = self.readiness.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Profile:
        """Rebuild from :meth:`to_dict`; raise :class:`ProfileError` on any defect."""
        try:
            if int(d.get("version", 0)) != PROFILE_VERSION:
                raise ProfileError(
                    f"profile version {d.get('version')!r} is not {PROFILE_VERSION}; re-profile"
                )
            pay = d["payload"]
            return cls(
                algorithm=str(d["algorithm"]),
                params=dict(d.get("params", {})),
                payload=PayloadModel(float(pay["bytes_per_element"]), float(pay["header"])),
                compute={k: costfn_from_dict(v) for k, v in dict(d["compute"]).items()},
                network={k: comm_op_from_dict(v) for k, v in dict(d["network"]).items()},
                overlap=float(d.get("overlap", 1.0)),
                meta=dict(d.get("meta", {})),
                compute_scale=float(d.get("compute_scale", 1.0)),
                call_ms=float(d.get("call_ms", 0.0)),
                compute_scale_by_size=tuple(
                    (float(x), float(s)) for x, s in d.get("compute_scale_by_size", ())
                ),
                encode_checks_finite=bool(d.get("encode_checks_finite", False)),
                readiness=None
                if d.get("readiness") is None
                else Readiness.from_dict(d["readiness"]),
            )
        except ProfileError:
            raise
        except CostFnError as exc:
            raise ProfileError(f"malformed profile: {exc}") from None
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ProfileError(f"malformed profile: {type(exc).__name__}: {exc}") from None

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Profile:
        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as exc:
            raise ProfileError(f"profile is not valid JSON: {exc}") from None

    def save(self, path: str | Path) -> None:
        """Write JSON atomically (temp file + rename)."""
        p = Path(path)
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(self.to_json())
        tmp.replace(p)

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ProfileError(f"cannot read profile {path}: {exc.strerror}") from None
        return cls.from_json(text)


def affine_profile(
    algorithm: str,
    *,
    encode: tuple[float, float, float],
    decode: tuple[float, float, float],
    merge: tuple[float, float, float],
    bytes_per_element: float,
    header: float = 0.0,
    bandwidth_bytes_per_s: float = 1.25e9,
    latency_s: float = 25e-6,
    overlap: float = 1.0,
    params: Mapping[str, Any] | None = None,
) -> Profile:
    """A profile from constants: compute ops as ``(w ms/element, b ms, floor ms)``
    affine-with-floor costs, a payload model and a link. For planning from published figures
    (e.g. a GPU's encode throughput) and for tests."""
    from hipress.secopa.model.costfn import AffineFloor

    return Profile(
        algorithm=algorithm,
        params=dict(params or {}),
        payload=PayloadModel(bytes_per_element, header),
        compute={
            "encode": AffineFloor(*encode),
            "decode": AffineFloor(*decode),
            "merge": AffineFloor(*merge),
        },
        network=link_network(bandwidth_bytes_per_s, latency_s),
        overlap=overlap,
        meta={
            "network_source": {
                "kind": "link",
                "bandwidth_bytes_per_s": bandwidth_bytes_per_s,
                "latency_s": latency_s,
            }
        },
    )
