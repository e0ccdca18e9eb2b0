"""Markdown tables of benchmark results, one function per benchmark: each takes the JSON a
``hipress bench`` command (or ``hipress demo``) wrote and returns the table's lines. The result
files of :mod:`hipress.bench.report` and the generated tables of the docs both come from here."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

__all__ = ["TABLES", "convergence_rows", "e2e_cell_rows", "fmt", "robustness_table"]

Table = Callable[[dict[str, Any]], list[str]]


def fmt(x: float | None, spec: str) -> str:
    """``x`` formatted by ``spec``, or ``-`` for a missing figure."""
    return "-" if x is None else format(x, spec)


def _signed(x: float | None) -> str:
    return "-" if x is None else f"{x:+.2f}"


def e2e_cell_rows(cell: dict[str, Any]) -> list[str]:
    """One (model, network) cell of ``hipress bench e2e``: a row per configuration."""
    out = [
        "| configuration | samples/s | step ms | MB/step | x fp32 | x fp16 | x PowerSGD | eff x | "
        "floor ms | eff bound x |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
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
            f"{fmt(None if wire is None else wire / 1e6, '.2f')} | "
            f"{fmt(sp.get('ddp-fp32'), '.2f')} | {fmt(sp.get('ddp-fp16'), '.2f')} | "
            f"{fmt(sp.get('ddp-powersgd'), '.2f')} | "
            f"{fmt(r.get('scaling_efficiency'), '.2f')} | "
            f"{fmt(r.get('network_floor_ms'), '.1f')} | {fmt(r.get('efficiency_bound'), '.2f')} |"
        )
    return out


def e2e_table(results: dict[str, Any]) -> list[str]:
    """Every cell of ``hipress bench e2e``, each under its model and network."""
    out: list[str] = []
    for cell in results["cells"]:
        out += ["", f"{cell['model']} ({cell['kind']}), {cell['network']['label']}:", ""]
        out += e2e_cell_rows(cell)
    return out[1:]


def _pct_spread(r: dict[str, Any], key: str) -> str:
    s = r[key]
    return f"{100 * s['mean']:.2f} ({100 * s['min']:.2f}-{100 * s['max']:.2f})"


def _gap(r: dict[str, Any], key: str) -> str:
    mean = r.get(f"{key}_points")
    span = r.get(f"{key}_range")
    if mean is None or span is None:
        return _signed(mean)
    return f"{mean:+.2f} ({span[0]:+.2f}..{span[1]:+.2f})"


def _convergence_seeds_rows(results: dict[str, Any]) -> list[str]:
    out = [
        "| algorithm | EF | final % mean (min-max) | vs uncompressed pp (per seed) | best % mean "
        "(min-max) | vs best uncompressed pp (per seed) | best epochs | final valid loss | "
        "train s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results["rows"]:
        ef = {None: "-", True: "yes", False: "no"}[r["error_feedback"]]
        if "accuracy" not in r:
            err = r.get("error", "no result").strip().splitlines()[-1][:160]
            out.append(f"| {r['algorithm']} | {ef} | failed: {err} | | | | | | |")
            continue
        out.append(
            f"| {r['algorithm']} | {ef} | {_pct_spread(r, 'final')} | {_gap(r, 'delta')} | "
            f"{_pct_spread(r, 'best')} | {_gap(r, 'best_delta')} | "
            f"{','.join(map(str, r['best_epochs']))} | {r['valid_loss']:.3f} | "
            f"{fmt(r.get('seconds'), '.0f')} |"
        )
    return out


def convergence_rows(results: dict[str, Any]) -> list[str]:
    """``hipress bench convergence``: final and best accuracy of each algorithm; over several
    seeds (results with ``runs``), the mean with the range over the seeds, and the gap of the
    means with the range of the per-seed gaps."""
    if any("runs" in r for r in results["rows"]):
        return _convergence_seeds_rows(results)
    out = [
        "| algorithm | EF | final accuracy % | vs uncompressed pp | best % (epoch) | vs best "
        "uncompressed pp | final valid loss | train s |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results["rows"]:
        ef = {None: "-", True: "yes", False: "no"}[r["error_feedback"]]
        if "accuracy" not in r:
            err = r.get("error", "no result").strip().splitlines()[-1][:160]
            out.append(f"| {r['algorithm']} | {ef} | failed: {err} | | | | | |")
            continue
        out.append(
            f"| {r['algorithm']} | {ef} | {100 * r['accuracy']:.2f} | "
            f"{_signed(r.get('delta_points'))} | {100 * r['best_accuracy']:.2f} "
            f"({r['best_epoch']}) | {_signed(r.get('best_delta_points'))} | "
            f"{r['valid_loss']:.3f} | {r['seconds']:.0f} |"
        )
    return out


def kernels_table(results: dict[str, Any]) -> list[str]:
    """``hipress bench kernels`` at its largest size: GB/s, % of roofline, x torch ops."""
    sizes = sorted({int(n) for rows in results["kernels"].values() for n in rows})
    n = str(sizes[-1])
    out = [
        f"{sizes[-1]:,} elements, GB/s of float32 gradient input; copy "
        f"{results['copy'][n]:.1f} GB/s, read {results['read'][n]:.1f} GB/s; sum2/w and sum4/w: "
        "the average of 2 and 4 payloads in times of writing the output once (its bound).",
        "",
        "| algorithm | encode GB/s | % roof | decode GB/s | % roof | x torch encode | "
        "x torch decode | sum4 x | sum2/w x (bound) | sum4/w x (bound) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in sorted(results["kernels"]):
        r = results["kernels"][name].get(n)
        if r is None:
            continue
        te, td = r.get("torch_encode"), r.get("torch_decode")
        out.append(
            f"| {name} | {r['encode']:.2f} | {100 * r['encode'] / r['encode_roofline']:.0f} | "
            f"{r['decode']:.2f} | {100 * r['decode'] / r['decode_roofline']:.0f} | "
            f"{fmt(r['encode'] / te if te else None, '.1f')} | "
            f"{fmt(r['decode'] / td if td else None, '.1f')} | "
            f"{r['decode_sum4'] / r['decode_sum4_by_parts']:.1f} | "
            + " | ".join(
                f"{r[f'decode_sum{k}_vs_write']:.2f} ({r[f'sum{k}_bound']:.2f})"
                if f"sum{k}_bound" in r
                else "-"
                for k in (2, 4)
            )
            + " |"
        )
    return out


def plan_table(results: dict[str, Any]) -> list[str]:
    """``hipress bench plan``: predicted against measured sync time of each plan."""
    out = [
        f"{results['model']} on {results['world_size']} processes "
        f"({results['network']['label']}), {results['algorithm']} {results['params']}.",
        "",
        "| plan | compressed tensors | predicted ms | measured ms | error % |",
        "|---|---:|---:|---:|---:|",
    ]
    for key, r in results["rows"].items():
        err = (r["predicted_ms"] - r["measured_ms"]) / r["measured_ms"]
        out.append(
            f"| {key} | {r['compressed']} | {r['predicted_ms']:.2f} | {r['measured_ms']:.2f} "
            f"| {100 * err:+.1f} |"
        )
    return out


def sync_table(results: dict[str, Any]) -> list[str]:
    """``hipress bench sync`` at its largest tensor: ms per sync of each method."""
    rows = results["rows"]
    top = max(r["bytes"] for r in rows)
    out = [
        f"One sync of {top / 2**20:g} MB of float32 gradient; median ms, speed-up over DDP's "
        "allreduce in the same network and world size, bytes sent against fp32.",
        "",
        "| network | workers | method | ms | x DDP | sent % |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        if r["bytes"] == top:
            out.append(
                f"| {r['network']} | {r['world_size']} | {r['method']} | {r['ms']:.2f} | "
                f"{r['speedup']:.2f} | {100 * r['ratio']:.1f} |"
            )
    return out


def costfit_table(results: dict[str, Any]) -> list[str]:
    """``hipress bench costfit``: held-out relative error of each cost-function form."""
    out = [
        "| algorithm | op | form | median error | max error |",
        "|---|---|---|---:|---:|",
    ]
    for r in results["rows"]:
        out.append(
            f"| {r['algorithm']} | {r['op']} | {r['form']} | {r['median_error']:.3f} | "
            f"{r['max_error']:.2f} |"
        )
    return out


def ring_table(results: dict[str, Any]) -> list[str]:
    """``hipress bench ring``: in how many cases the compressed Ring is predicted fastest."""
    out = [
        "| algorithm | variant, overlap | Ring faster in | best ring / min(ps, allgather) | at |",
        "|---|---|---:|---:|---|",
    ]
    for name, entry in results["algorithms"].items():
        for key, s in entry["summary"].items():
            at = s["best_at"]
            out.append(
                f"| {name} | {key.replace('@', ', ')} | {s['wins']} of {s['cases']} | "
                f"{s['best_ratio']:.2f} | N={at['n']}, {at['bits_per_s']:.0e} bit/s, "
                f"m={at['m']} |"
            )
    return out


def demo_table(results: dict[str, Any]) -> list[str]:
    """``hipress demo``: throughput, bytes sent and validation figures of each run."""
    out = [
        "| run | samples/s | MB sent/step/worker | val loss | val acc % | wall s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in results["runs"]:
        out.append(
            f"| {r['spec']['name']} | {r['samples_per_s']:.1f} | {r['bytes_per_step'] / 2**20:.2f} "
            f"| {r['final']['loss']:.3f} | {100 * r['final']['accuracy']:.1f} | "
            f"{r['wall_s']:.1f} |"
        )
    return out


def robustness_table(results: dict[str, Any]) -> list[str]:
    """``hipress bench robustness``: what ran, then one row per algorithm and one column per
    optimizer (eval loss, its ratio to DDP's, verdict), then every refusal's message."""
    m, rows = results["meta"], results["rows"]
    if m["task"] == "mlp":
        what = (f"MLP {m['features']} -> {m['hidden']} -> {m['classes']} on a synthetic linear "
                f"task, {m['batch']} samples per worker per step")  # fmt: skip
    else:
        what = (f"LSTM LM ({m['vocab']} words) on Python stdlib sources, {m['batch']} x "
                f"{m['bptt']}-token windows per worker per step")  # fmt: skip
    optimizers = list(dict.fromkeys(r["optimizer"] for r in rows))
    cell = {(r["algorithm"], r["optimizer"]): r for r in rows}
    out = [
        f"{what}; {m['workers']} workers, {m['steps']} steps, no clipping; SGD lr {m['sgd_lr']} "
        f"momentum {m['momentum']}, AdamW lr {m['adamw_lr']}; every algorithm with its default "
        f"parameters and CaSync's default plan. Eval loss (ratio to DDP's with the same "
        f"optimizer); ok: within {100 * m['tolerance']:g}% of DDP's, or below it.",
        "",
        "| algorithm | " + " | ".join(optimizers) + " |",
        "|---|" + "---|" * len(optimizers),
    ]
    refusals = []
    for name in dict.fromkeys(r["algorithm"] for r in rows):
        parts = []
        for o in optimizers:
            r = cell.get((name, o))
            if r is None:
                parts.append("-")
            elif "refused" in r:
                parts.append("refused")
                refusals.append(f"- {name} with {o}: {r['refused']}")
            else:
                parts.append(f"{r['loss']:.4g} ({r['ratio']:.2f}x) {r['verdict']}")
        out.append(f"| {name} | " + " | ".join(parts) + " |")
    if refusals:
        out += ["", "Refused by `register`:", "", *refusals]
    return out


def diloco_table(results: dict[str, Any]) -> list[str]:
    """``python -m hipress.bench.diloco`` runs (``results["runs"]``), a table each: every row's
    samples/s, utilisation against the run's better compute-only row, MB on the wire per step,
    seconds per outer sync (fragment sync when streaming) and the part the loop waited, and the
    utilisation the loop's own sync work allows (``cpu_bound``, where the run has it)."""
    out: list[str] = []
    for run in results["runs"]:
        m, rows = run["meta"], run["rows"]
        ref = max(r["samples_per_s"] for r in rows if r["row"] == "compute" and "error" not in r)
        bound = any("cpu_bound" in r for r in rows)  # runs before it was measured lack it
        out += ["", f"{m['model']}, {m['workers']} workers, {m['rate_mbit']:g} Mbit/s, "
                    f"{m['steps']} timed steps per row:", "",
                "| row | samples/s | utilisation | " + "cpu bound | " * bound
                + "MB/step | s per outer sync | s waited |",
                "|---|---:|---:|" + "---:|" * bound + "---:|---:|---:|"]  # fmt: skip
        for r in rows:
            if "error" in r:
                out.append(f"| {r['row']} | failed |")
                continue
            wire = r.get("wire_bytes_per_step")
            cpu = f"{fmt(r.get('cpu_bound'), '.3f')} | " * bound
            out.append(
                f"| {r['row']} | {r['samples_per_s']:.1f} | {r['samples_per_s'] / ref:.3f} | "
                f"{cpu}{fmt(None if wire is None else wire / 1e6, '.3f')} | "
                f"{fmt(r.get('outer_sync_s'), '.3f')} | {fmt(r.get('outer_wait_s'), '.3f')} |"
            )
    return out[1:]


TABLES: Mapping[str, Table] = MappingProxyType(
    {
        "e2e": e2e_table,
        "e2e-2w": e2e_table,
        "convergence": convergence_rows,
        "convergence-tabular": convergence_rows,
        "convergence-fsdp": convergence_rows,
        "convergence-fsdp-tabular": convergence_rows,
        "kernels": kernels_table,
        "plan": plan_table,
        "sync": sync_table,
        "costfit": costfit_table,
        "ring": ring_table,
        "demo": demo_table,
        "robustness-mlp": robustness_table,
        "robustness-lm": robustness_table,
        "diloco": diloco_table,
    }
)
