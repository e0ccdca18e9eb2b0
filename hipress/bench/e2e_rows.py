"""The figures of ``hipress bench e2e`` derived from its runs (:mod:`hipress.bench.e2e`): each
configuration's best round, its speedups and scaling efficiency, its network floor, and the FSDP2
blocks."""

from __future__ import annotations

from typing import Any

from hipress.bench.e2e_configs import BASELINES, COMPUTE, NOCOMM, E2EOptions
from hipress.bench.fsdp_rows import finish_block
from hipress.bench.report import check_fsdp_targets
from hipress.bench.tail import allreduce_bytes, bucket_leads, bytes_sent, exposed_floor_ms
from hipress.secopa.model.ddpbuckets import ddp_caps

__all__ = ["best_round", "derive", "floors", "fsdp_blocks"]


def best_round(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The round of one configuration with the most samples/s, with every round's rate
    (``rounds_samples_per_s``); the last round when none ran."""
    ok = [r for r in rounds if "samples_per_s" in r]
    if not ok:
        return rounds[-1]
    best = dict(max(ok, key=lambda r: r["samples_per_s"]))
    best["rounds_samples_per_s"] = [r.get("samples_per_s") for r in rounds]
    return best


def derive(rows: list[dict[str, Any]]) -> None:
    """Add to each row of one cell, in place, its ``speedup`` over each baseline, its
    ``scaling_efficiency`` (against compute-only) and ``of_ddp_ceiling`` (against DDP with no
    gradient exchange)."""
    by = {r["config"]: r for r in rows if "samples_per_s" in r}
    compute = by.get(COMPUTE.name)
    for r in rows:
        if "samples_per_s" not in r:
            continue
        r["speedup"] = {
            b.name: r["samples_per_s"] / by[b.name]["samples_per_s"]
            for b in BASELINES
            if b.name in by
        }
        if compute is not None:
            r["scaling_efficiency"] = r["samples_per_s"] / compute["samples_per_s"]
        if NOCOMM.name in by:  # against DDP's own ceiling
            r["of_ddp_ceiling"] = r["samples_per_s"] / by[NOCOMM.name]["samples_per_s"]


def floors(
    rows: list[dict[str, Any]], numels: dict[str, int], world_size: int, rate_mbit: float | None
) -> None:
    """Each DDP fp32/fp16 and hipress row's network floor (hipress-powersgd's too: each
    round's bytes, :func:`~hipress.bench.tail.bytes_sent`) (:mod:`hipress.bench.tail`): the
    least communication any schedule of its bytes leaves exposed after backward on this link
    (``network_floor_ms``), and the scaling efficiency that allows (``efficiency_bound``); and
    the same under the row's DDP buckets, where a bucket's bytes leave once its last gradient
    is ready (``bucket_floor_ms``, ``bucket_efficiency_bound``: :func:`~hipress.bench.tail.
    bucket_leads`)."""
    from hipress.casync.buckets import first_is_cap
    from hipress.compll import load

    by = {r["config"]: r for r in rows if "samples_per_s" in r}
    compute = by.get(COMPUTE.name)
    if compute is None or rate_mbit is None or "grad_ready_lead_ms" not in compute:
        return
    leads = compute["grad_ready_lead_ms"]
    first = first_is_cap()
    for r in by.values():
        if r["config"] in ("ddp-fp32", "ddp-fp16"):
            width = 4.0 if r["config"] == "ddp-fp32" else 2.0
            sent = {n: allreduce_bytes(width * k, world_size) for n, k in numels.items()}
        elif "plan" in r:  # (no algorithm: every entry plain, dense or as exact rows)
            rounds = r["plan"].get("round_bytes")  # (a multi-round algorithm: PowerSGD)
            pay = load(r["algorithm"], backend="reference").payload_nbytes if (
                "algorithm" in r and rounds is None) else _no_payload  # fmt: skip
            sent = bytes_sent(r["plan"]["entries"], pay, world_size, rounds)
        else:
            continue
        floor = exposed_floor_ms(leads, sent, rate_mbit)
        r["network_floor_ms"] = floor
        r["efficiency_bound"] = compute["step_ms"] / (compute["step_ms"] + floor)
        # the same under the row's DDP buckets: a bucket's bytes leave when its last is ready
        caps = ddp_caps(r.get("bucket_cap_mb"), first)
        held = bucket_leads(leads, numels, caps.cap_mb, caps.first_mb)
        floor = exposed_floor_ms(held, sent, rate_mbit)
        r["bucket_floor_ms"] = floor
        r["bucket_efficiency_bound"] = compute["step_ms"] / (compute["step_ms"] + floor)


def _no_payload(numel: int) -> int:
    raise ValueError("a plan without an algorithm compresses nothing")


def fsdp_blocks(
    opts: E2EOptions, runs: dict[tuple[bool, str], list[dict[str, Any]]], cell: dict[str, Any]
) -> list[dict[str, Any]]:
    """The cell's FSDP2 rows (each configuration's best round), a block per reshard setting,
    with what :func:`hipress.bench.fsdp_rows.finish_block` derives and the targets."""
    compute = next((r for r in cell["rows"] if r["config"] == COMPUTE.name), {})
    blocks = []
    for reshard in opts.fsdp_reshard:
        rows = [best_round(v) for (rs, _), v in runs.items() if rs == reshard]
        block = finish_block(rows, reshard, compute.get("samples_per_s"))
        block["targets"] = check_fsdp_targets(cell, block)
        blocks.append(block)
    return blocks
