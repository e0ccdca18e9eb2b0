"""Writing benchmark results: JSON (everything), a markdown table, a PNG (matplotlib, if
installed), and the issue's target check for the end-to-end benchmark."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

__all__ = ["check_targets", "e2e_markdown", "e2e_png", "write_json"]

logger = logging.getLogger(__name__)

TARGET_VS_FP32 = 2.0
TARGET_VS_BEST_HOOK = 1.3
TARGET_EFFICIENCY = 0.8


def write_json(obj: Any, path: Path) -> None:
    """Write ``obj`` as indented JSON, atomically (a temp file renamed over ``path``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=False) + "\n")
    tmp.replace(path)


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def check_targets(cell: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets on one cell: the best hipress row against DDP fp32 (>= 2x), against the
    better of the fp16 and PowerSGD hooks (>= 1.3x), and its scaling efficiency (>= 0.8).
    They apply to the communication-heavy model on 1 Gbit/s shaped links only (elsewhere returns
    ``{"best": None, "applies": False}``). Returns the figures and a ``met`` flag per target
    (None when a figure is missing)."""
    net = cell["network"]
    if not (
        cell["kind"] == "communication-heavy" and net.get("shaped") and net.get("rate_mbit") == 1000
    ):
        return {"best": None, "applies": False}
    rows = {r["config"]: r for r in cell["rows"] if "samples_per_s" in r}
    ours = [r for n, r in rows.items() if n.startswith("hipress-")]
    if not ours:
        return {"best": None, "applies": True}
    best = max(ours, key=lambda r: r["samples_per_s"])
    hooks = [rows[n]["samples_per_s"] for n in ("ddp-fp16", "ddp-powersgd") if n in rows]
    fp32 = rows.get("ddp-fp32", {}).get("samples_per_s")
    vs_fp32 = best["samples_per_s"] / fp32 if fp32 else None
    vs_hook = best["samples_per_s"] / max(hooks) if hooks else None
    eff = best.get("scaling_efficiency")
    return {
        "best": best["config"],
        "applies": True,
        "vs_fp32": vs_fp32,
        "vs_best_hook": vs_hook,
        "scaling_efficiency": eff,
        "met": {
            "vs_fp32": None if vs_fp32 is None else vs_fp32 >= TARGET_VS_FP32,
            "vs_best_hook": None if vs_hook is None else vs_hook >= TARGET_VS_BEST_HOOK,
            "scaling_efficiency": None if eff is None else eff >= TARGET_EFFICIENCY,
        },
    }


def e2e_markdown(results: dict[str, Any]) -> str:
    """The end-to-end results as markdown: one table per (model, network) cell, then targets."""
    meta = results["meta"]
    out = [
        "# End-to-end throughput",
        "",
        f"{meta['workers']} workers, {meta['steps']} timed steps after {meta['warmup']} warm-up "
        f"steps, best of {meta.get('repeats', 1)} round(s), "
        f"{meta['threads_per_worker']} torch thread(s) per worker, torch {meta['torch']}, "
        f"{meta['date']}. Command: `{meta.get('command', '?')}`",
        "",
        "samples/s: all workers together. MB/step: bytes each worker transmitted on its NIC per "
        "step (TCP/IP included). xN: speedup over that baseline. eff: samples/s over the "
        "compute-only rate of the same N processes (no gradient exchange).",
    ]
    for cell in results["cells"]:
        net = cell["network"]
        out += [
            "",
            f"## {cell['model']} ({cell['kind']}), {net['label']}",
            "",
            f"{cell['parameters'] / 1e6:.2f}M parameters ({cell['gradient_bytes'] / 1e6:.1f} MB "
            f"of fp32 gradient), {cell['batch_per_worker']} {cell['unit']} per worker per step; "
            f"data: {cell['data']}. One process alone, compute only: "
            f"{_fmt(cell.get('compute_alone_samples_per_s'), '.1f')} samples/s. "
            f"Load average during the cell: {_fmt(cell.get('loadavg'), '.1f')}.",
            "",
            "| configuration | samples/s | step ms | MB/step | x fp32 | x fp16 | x PowerSGD | eff |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in cell["rows"]:
            if "samples_per_s" not in r:
                err = r["error"].strip().splitlines()[-1][:160]
                out.append(f"| {r['config']} | failed: {err} |")
                continue
            sp = r.get("speedup", {})
            wire = r.get("wire_bytes_per_step")
            out.append(
                f"| {r['config']} | {r['samples_per_s']:.1f} | {r['step_ms']:.0f} | "
                f"{_fmt(None if wire is None else wire / 1e6, '.2f')} | "
                f"{_fmt(sp.get('ddp-fp32'), '.2f')} | {_fmt(sp.get('ddp-fp16'), '.2f')} | "
                f"{_fmt(sp.get('ddp-powersgd'), '.2f')} | "
                f"{_fmt(r.get('scaling_efficiency'), '.2f')} |"
            )
        t = check_targets(cell)
        if t.get("best"):
            met = t["met"]

            def mark(key: str, met: dict[str, Any] = met) -> str:
                return {True: "met", False: "NOT met", None: "n/a"}[met[key]]

            out += [
                "",
                f"Targets (best hipress: {t['best']}): "
                f"{_fmt(t['vs_fp32'], '.2f')}x DDP fp32 (target {TARGET_VS_FP32}x: "
                f"{mark('vs_fp32')}); {_fmt(t['vs_best_hook'], '.2f')}x the better hook "
                f"(target {TARGET_VS_BEST_HOOK}x: {mark('vs_best_hook')}); efficiency "
                f"{_fmt(t['scaling_efficiency'], '.2f')} (target {TARGET_EFFICIENCY}: "
                f"{mark('scaling_efficiency')}).",
            ]
    return "\n".join(out) + "\n"


def e2e_png(results: dict[str, Any], path: Path) -> bool:
    """Bar charts of samples/s and MB/step per configuration, one row per cell. Returns False
    (and logs) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib not installed: no %s", path)
        return False
    cells = results["cells"]
    fig, axes = plt.subplots(len(cells), 2, figsize=(12, 3.2 * len(cells)), squeeze=False)
    for (ax_rate, ax_bytes), cell in zip(axes, cells, strict=True):
        rows = [r for r in cell["rows"] if "samples_per_s" in r]
        names = [r["config"] for r in rows]
        colors = [
            "0.6" if n == "compute-only" else "tab:blue" if n.startswith("ddp") else "tab:orange"
            for n in names
        ]
        ax_rate.barh(names, [r["samples_per_s"] for r in rows], color=colors)
        ax_rate.invert_yaxis()
        ax_rate.set_xlabel("samples/s (all workers)")
        ax_rate.set_title(f"{cell['model']}, {cell['network']['label']}", fontsize=9)
        wire = [(r.get("wire_bytes_per_step") or 0) / 1e6 for r in rows]
        ax_bytes.barh(names, wire, color=colors)
        ax_bytes.invert_yaxis()
        ax_bytes.set_xscale("symlog", linthresh=0.1)
        ax_bytes.set_xlabel("MB sent per worker per step (log)")
        for i, r in enumerate(rows):
            eff = r.get("scaling_efficiency")
            if eff is not None and r["config"] != "compute-only":
                ax_rate.text(r["samples_per_s"], i, f" eff {eff:.2f}", va="center", fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
