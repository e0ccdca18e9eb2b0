"""The local-step rows of ``hipress bench e2e`` (:mod:`hipress.bench.e2e`): hipress's DiLoCo per
algorithm and H, the same uncompressed, PyTorch's post-local SGD and torchft's DiLoCo, run by
the local-step benchmark's worker (:func:`hipress.bench.diloco.train`) in the same network and
rounds as the cell's other rows, against the same compute-only row.

A row is named as :func:`hipress.bench.diloco.parse_variants` reads it (``diloco-onebit-h16``,
``diloco-none-h16``, ``postlocal-h16``, ``torchft-h16``). It warms up for one period of H
steps and times the cell's ``steps`` rounded up to whole periods. Figures beside the cell's
usual ones: ``utilisation`` (samples/s over compute-only, as ``scaling_efficiency``),
``wire_bytes_per_step``, ``outer_sync_s`` and ``outer_wait_s`` (hipress's DiLoCo: seconds per
outer sync in all, and the part the inner loop stood waiting; also ``outer_encode_s``,
``outer_decode_s`` and ``outer_step_s``, and ``cpu_bound``, the utilisation those three leave
on an infinitely fast link: :func:`hipress.bench.diloco.cpu_bound`) and, for every row,
``sync_exposed_ms`` (what a period of H steps took beyond H compute-only steps: the time each
outer sync cost the training loop).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from hipress.bench import diloco
from hipress.bench.netsim import LoopbackNetwork, Network, run_in_network
from hipress.bench.workloads import WORKLOADS

__all__ = ["finish_local", "local_markdown", "local_rows", "run_local", "steps_for"]

logger = logging.getLogger(__name__)

LOCAL_KINDS = ("diloco", "postlocal", "torchft")


def local_rows(variants: tuple[str, ...], algorithms: tuple[str, ...]) -> list[diloco.Row]:
    """The rows ``variants`` name (``hH`` with each of ``algorithms``); ValueError for a
    variant that is not one."""
    return diloco.parse_variants(variants, algorithms)


def steps_for(row: diloco.Row, steps: int) -> int:
    """``steps`` rounded up to whole periods of the row's H."""
    return -(-steps // row.h) * row.h


def describe(row: diloco.Row) -> str:
    """One line for tables."""
    if row.kind == "postlocal":
        return f"PyTorch post-local SGD, averaging every {row.h} steps"
    if row.kind == "torchft":
        return f"torchft {diloco.version()} DiLoCo, H {row.h}, uncompressed"
    codec = row.algorithm or "uncompressed"
    streaming = f", {row.fragments} fragments, tau {row.delay}" if row.fragments > 1 else ""
    return f"hipress DiLoCo, H {row.h}, {codec}{streaming}"


def run_local(net: Network, model_name: str, data: Any, row: diloco.Row, steps: int, lr: float,
              timeout: float, threads: int) -> dict[str, Any]:  # fmt: skip
    """One local-step row on an entered network, as a row of the cell; a failure returns
    ``{"config": name, "error": message}``."""
    t = time.perf_counter()
    n = steps_for(row, steps)
    addresses = list(getattr(net, "addresses", ["127.0.0.1"] * net.world_size))
    try:
        per_rank = run_in_network(net, diloco.train, model_name, data, row, n, lr, net.iface,
                                  addresses, timeout=timeout, threads=threads)  # fmt: skip
    except Exception as exc:  # a worker's failure is a result to report, not a crash
        logger.error("e2e: %s on %s failed: %s", row.variant, model_name, exc)
        return {"config": row.variant, "error": str(exc)[-2000:]}
    loopback = isinstance(net, LoopbackNetwork)
    res = diloco.summarise(row, per_rank, WORKLOADS[model_name].batch_size, n, loopback)
    del res["row"]
    res = {"config": row.variant, "describe": describe(row), **res, "steps": n}
    if row.kind == "torchft":
        res["torchft"] = diloco.version()
    res["wall_s"] = time.perf_counter() - t
    logger.info("e2e: %s %s: %.1f samples/s", model_name, row.variant, res["samples_per_s"])
    return res


def finish_local(rows: list[dict[str, Any]], compute_name: str) -> None:
    """Add ``utilisation`` and ``sync_exposed_ms`` to each local-step row of a cell, in place
    (after :func:`hipress.bench.e2e_rows.derive`)."""
    compute = next((r for r in rows if r["config"] == compute_name and "step_ms" in r), None)
    for r in rows:
        if r.get("kind") not in LOCAL_KINDS or "samples_per_s" not in r:
            continue
        r["utilisation"] = r.get("scaling_efficiency")
        if compute is not None:
            r["sync_exposed_ms"] = max(0.0, r["step_ms"] - compute["step_ms"]) * r["h"]
            if "outer_step_s" in r:
                r["cpu_bound"] = diloco.cpu_bound(r, compute["step_ms"] / 1000)


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def local_markdown(cell: dict[str, Any]) -> list[str]:
    """The cell's local-step rows as a markdown table (empty without any)."""
    rows = [r for r in cell["rows"] if r.get("kind") in LOCAL_KINDS]
    if not rows:
        return []
    out = [
        "| local steps | H | samples/s | utilisation x | cpu bound x | MB/step | "
        "s per outer sync | waited s | ms exposed per sync | loss |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "samples_per_s" not in r:
            continue
        wire = r.get("wire_bytes_per_step")
        out.append(
            f"| {r['config']} | {r['h']} | {r['samples_per_s']:.1f} | "
            f"{_fmt(r.get('utilisation'), '.3f')} | {_fmt(r.get('cpu_bound'), '.3f')} | "
            f"{_fmt(None if wire is None else wire / 1e6, '.3f')} | "
            f"{_fmt(r.get('outer_sync_s'), '.3f')} | {_fmt(r.get('outer_wait_s'), '.3f')} | "
            f"{_fmt(r.get('sync_exposed_ms'), '.0f')} | {_fmt(r.get('final_loss'), '.3f')} |"
        )
    return out
