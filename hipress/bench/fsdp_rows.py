"""The FSDP2 rows of ``hipress bench e2e --fsdp`` (:mod:`hipress.bench.e2e`): which
configurations a cell runs, and what is derived from a block of measured rows (speedups over the
FSDP2 baselines, efficiency, wire bytes over payload, the bound of compressing the
reduce-scatter alone). The rows themselves are measured by :func:`hipress.bench.fsdp.measure`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hipress.bench.fsdp import BASELINES, BF16_PARAMS, FsdpConfig, derive_speedups

__all__ = ["e2e_configs", "finish_block", "traffic_bound"]


def e2e_configs(algorithms: Iterable[str], bf16_params: bool) -> list[FsdpConfig]:
    """The two baselines, hipress over FSDP2 with each algorithm (feedback "auto"), then with
    ``bf16_params`` the bfloat16 policy plain and with each algorithm."""
    algorithms = tuple(algorithms)
    out = [*BASELINES]
    out += [FsdpConfig(f"fsdp-hipress-{a}", "hipress", algorithm=a) for a in algorithms]
    if bf16_params:
        out.append(BF16_PARAMS)
        out += [FsdpConfig(f"fsdp-hipress-{a}-bf16", "hipress", "bf16", algorithm=a,
                           params="bf16") for a in algorithms]  # fmt: skip
    return out


def finish_block(
    rows: list[dict[str, Any]], reshard: bool, compute_samples_per_s: float | None
) -> dict[str, Any]:
    """A block of one reshard setting's rows: gives each measured row ``speedup`` (over every
    FSDP2 baseline among ``rows``), ``scaling_efficiency`` (against the compute-only rate, when
    given) and ``wire_over_payload`` (measured bytes over expected payload, where measured).
    Returns ``{"reshard_after_forward", "rows", "bound"}``."""
    derive_speedups(rows)
    for r in rows:
        if "samples_per_s" in r and compute_samples_per_s:
            r["scaling_efficiency"] = r["samples_per_s"] / compute_samples_per_s
        wire, traffic = r.get("wire_bytes_per_step"), r.get("traffic")
        if wire and traffic and traffic["total_bytes"]:
            r["wire_over_payload"] = wire / traffic["total_bytes"]
    return {"reshard_after_forward": reshard, "rows": rows, "bound": traffic_bound(rows)}


def traffic_bound(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What compressing only the reduce-scatter can give where the link is the bottleneck:
    plain FSDP2's bytes per step (and the bf16-reduce peer's) over the least of the
    float32-parameter hipress rows' (the all-gathers unchanged), from the payloads
    (``vs_*``) and, where measured, from the wire (``wire``: also ``reduce_scatter_factor``,
    the bytes plain FSDP2's reduce-scatter really sent over its payload, the all-gathers' wire
    bytes taken from the hipress row). ``allgather_units``: plain FSDP2's all-gather payload in
    units of its reduce-scatter payload."""
    by = {r["config"]: r for r in rows if "traffic" in r}
    plain = by.get(BASELINES[0].name)
    peer = by.get(BASELINES[1].name)
    ours = [r for n, r in by.items() if n.startswith("fsdp-hipress-") and r["params"] == "fp32"]
    if plain is None or not ours:
        return {}
    t = plain["traffic"]
    least = min(ours, key=lambda r: r["traffic"]["total_bytes"])
    out: dict[str, Any] = {
        "allgather_units": t["allgather_bytes"] / t["reduce_scatter_bytes"],
        "vs_fsdp_fp32": t["total_bytes"] / least["traffic"]["total_bytes"],
    }
    if peer is not None:
        out["vs_fsdp_bf16_reduce"] = (
            peer["traffic"]["total_bytes"] / least["traffic"]["total_bytes"]
        )
    wire = least.get("wire_bytes_per_step")
    if wire and plain.get("wire_bytes_per_step"):
        gathers = wire - least["traffic"]["reduce_scatter_bytes"]
        w = {
            "vs_fsdp_fp32": plain["wire_bytes_per_step"] / wire,
            "reduce_scatter_factor": (plain["wire_bytes_per_step"] - gathers)
            / t["reduce_scatter_bytes"],
        }
        if peer is not None and peer.get("wire_bytes_per_step"):
            w["vs_fsdp_bf16_reduce"] = peer["wire_bytes_per_step"] / wire
        out["wire"] = w
    return out
