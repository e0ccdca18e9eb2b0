"""Charts of benchmark results, drawn from their JSON: the kernels against their roofline
(:func:`kernels_figure`, ``hipress bench kernels``) and predicted against measured time
(:func:`prediction_figure`: ``hipress bench plan``'s sync time per plan, or ``hipress demo``'s
speed-up of each compressed run). Each raises :class:`~hipress.bench.charts.ChartError` for a
JSON it cannot read, naming what is missing."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hipress.bench.charts import ChartError, new_figure, save

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["kernels_figure", "prediction_figure", "write_kernels_chart", "write_prediction_chart"]

GBS = "GB/s of float32 gradient (4 bytes per element)"


def _need(results: Mapping[str, Any], key: str, what: str) -> Any:
    value = results.get(key)
    if not value:
        raise ChartError(f"not a {what} result: it has no {key!r}")
    return value


def _size_label(n: int) -> str:
    return f"{n:,} elements ({4 * n / 2**20:.3g} MiB of float32)"


def _kernel_panel(ax: Axes, rows: dict[str, dict[str, Any]], op: str, bound: float | None,
                  bound_label: str) -> None:  # fmt: skip
    """Bars of the generated kernels' ``op`` (encode or decode) GB/s, the torch-ops versions
    beside them, each kernel's roofline as a black bar top, and ``bound`` as a dashed line."""
    names = sorted(rows)
    x = list(range(len(names)))
    ours = [rows[n][op] for n in names]
    roof = [rows[n][f"{op}_roofline"] for n in names]
    bars = ax.bar([i - 0.2 for i in x], ours, width=0.4, color="tab:blue",
                  label=f"generated kernel ({op})")  # fmt: skip
    ax.bar_label(bars, labels=[f"{100 * v / r:.0f}%" for v, r in zip(ours, roof, strict=True)],
                 fontsize=7, padding=2)  # fmt: skip
    theirs = [rows[n].get(f"torch_{op}") for n in names]
    if any(t is not None for t in theirs):
        ax.bar([i + 0.2 for i in x], [t or 0.0 for t in theirs], width=0.4, color="0.7",
               label=f"torch ops ({op})")  # fmt: skip
    ax.hlines(roof, [i - 0.45 for i in x], [i + 0.05 for i in x], colors="black",
              linewidth=2, label="roofline (compulsory memory traffic; % = share reached)")  # fmt: skip
    if bound:
        ax.axhline(bound, color="tab:red", linestyle="--", linewidth=1, label=bound_label)
    ax.set_xticks(x, names, fontsize=8)
    ax.set_ylabel(f"{op}: {GBS}", fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax.margins(y=0.12)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def kernels_figure(results: Mapping[str, Any], size: int | None = None) -> Figure:
    """Encode (top) and decode (bottom) GB/s of every algorithm of a ``hipress bench kernels``
    result at one size (``size`` elements, default the largest measured), next to the torch-ops
    versions, under each kernel's roofline (the % above a bar is how close it gets). The
    encode panel marks the copy rate (the copy probe kernel), the decode panel the write-once
    bound (the write probe) where the result has it."""
    kernels = _need(results, "kernels", "`hipress bench kernels`")
    sizes = sorted({int(n) for rows in kernels.values() for n in rows})
    n = sizes[-1] if size is None else size
    rows = {name: by[str(n)] for name, by in kernels.items() if str(n) in by}
    if not rows:
        raise ChartError(f"no kernel measured at {n:,} elements (measured: "
                         f"{', '.join(f'{s:,}' for s in sizes)})")  # fmt: skip
    missing = sorted(k for k in ("encode", "decode", "encode_roofline", "decode_roofline")
                     if any(k not in r for r in rows.values()))  # fmt: skip
    if missing:
        raise ChartError(f"kernel rows at {n:,} elements lack {', '.join(missing)}")
    fig = new_figure(max(8.0, 0.75 * len(rows) + 4.5), 7.5)
    ax_enc, ax_dec = fig.subplots(2, 1, sharex=True)
    copy = (results.get("copy") or {}).get(str(n))
    write = (results.get("write") or {}).get(str(n))
    _kernel_panel(ax_enc, rows, "encode", copy, "copy rate (copy probe)")
    _kernel_panel(ax_dec, rows, "decode", write, "write-once bound (write probe)")
    m = results.get("machine") or {}
    where = m.get("gpu") or m.get("cpu") or "unknown machine"
    threads = f", {m['threads']} threads" if m.get("threads") else ""
    ax_enc.set_title(f"hipress bench kernels: {_size_label(n)}, {m.get('device', 'cpu')} "
                     f"({where}{threads})", fontsize=9)  # fmt: skip
    return fig


def _plan_rows(results: Mapping[str, Any]) -> Figure:
    rows = _need(results, "rows", "`hipress bench plan`")
    keys = [k for k in ("planned", "all_uncompressed", "all_compressed") if k in rows]
    keys += [k for k in rows if k not in keys]
    for k in keys:
        if "predicted_ms" not in rows[k] or "measured_ms" not in rows[k]:
            raise ChartError(f"plan row {k!r} lacks predicted_ms or measured_ms")
    fig = new_figure(8, 4.5)
    ax = fig.subplots()
    x = list(range(len(keys)))
    pred = [rows[k]["predicted_ms"] for k in keys]
    meas = [rows[k]["measured_ms"] for k in keys]
    ax.bar([i - 0.2 for i in x], pred, width=0.4, color="tab:purple", label="predicted")
    bars = ax.bar([i + 0.2 for i in x], meas, width=0.4, color="tab:green", label="measured")
    errs = [f"{100 * (p - m) / m:+.0f}%" if m else "" for p, m in zip(pred, meas, strict=True)]
    ax.bar_label(bars, labels=errs, fontsize=8, padding=2)
    ax.set_xticks(x, [f"{k}\n({rows[k].get('compressed', '?')} compressed)" for k in keys],
                  fontsize=8)  # fmt: skip
    ax.set_ylabel("sync time per step (ms)")
    ax.grid(axis="y", alpha=0.3)
    fig.legend(fontsize=8, loc="outside lower center", ncols=2,
               title="% above a bar: predicted against measured", title_fontsize=7)  # fmt: skip
    net = (results.get("network") or {}).get("label", "")
    ax.set_title(f"hipress bench plan: predicted vs measured sync time, {results.get('algorithm')}"
                 f", {results.get('world_size', '?')} workers\n{net}", fontsize=9)  # fmt: skip
    return fig


def _demo_runs(results: Mapping[str, Any]) -> Figure:
    runs = _need(results, "runs", "`hipress demo`")
    if len(runs) < 2:
        raise ChartError("a demo result needs a baseline run and at least one other")
    base = runs[0]
    others = runs[1:]
    if not all(r.get("samples_per_s", 0) > 0 for r in runs):
        raise ChartError("a demo run without a measured throughput (samples_per_s)")
    names = [r["spec"]["name"] for r in others]
    measured = [r["samples_per_s"] / base["samples_per_s"] for r in others]
    predicted = [r.get("predicted_speedup") or 0.0 for r in others]
    fig = new_figure(max(6.0, 2.2 * len(others) + 2), 4.5)
    ax = fig.subplots()
    x = list(range(len(others)))
    pb = ax.bar([i - 0.2 for i in x], predicted, width=0.4, color="tab:purple",
                label="predicted: the sync alone (the plan's cost model)")  # fmt: skip
    ax.bar_label(pb, labels=[f"{p:.2f}x" if p else "no prediction" for p in predicted],
                 fontsize=8, padding=2)  # fmt: skip
    mb = ax.bar([i + 0.2 for i in x], measured, width=0.4, color="tab:green",
                label="measured: the whole step (samples/s)")  # fmt: skip
    ax.bar_label(mb, labels=[f"{m:.2f}x" + ("\nfell back" if r.get("fell_back") else "")
                             for m, r in zip(measured, others, strict=True)],
                 fontsize=8, padding=2)  # fmt: skip
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--",
               label=f"{base['spec']['name']} (= 1)")  # fmt: skip
    ax.set_xticks(x, names, fontsize=8)
    ax.set_ylabel(f"speed-up over {base['spec']['name']} (x)")
    ax.grid(axis="y", alpha=0.3)
    ax.margins(y=0.2)
    fig.legend(fontsize=7, loc="outside lower center", ncols=1)
    cfg = results.get("config") or {}
    ax.set_title(f"hipress demo: predicted vs measured speed-up, {cfg.get('workers', '?')} "
                 f"workers\n{results.get('network', '')}", fontsize=9)  # fmt: skip
    return fig


def prediction_figure(results: Mapping[str, Any]) -> Figure:
    """Predicted against measured: for a ``hipress bench plan`` result (it has ``rows``), the
    sync time per step of each plan, with the prediction's error; for a ``hipress demo``
    result (``runs``), each run's predicted speed-up of the sync next to the measured speed-up
    of the whole step over the first run, and whether CaSync's check fell back."""
    if "rows" in results:
        return _plan_rows(results)
    if "runs" in results:
        return _demo_runs(results)
    raise ChartError("not a `hipress bench plan` or `hipress demo` result: it has neither "
                     "'rows' nor 'runs'")  # fmt: skip


def write_kernels_chart(results: Mapping[str, Any], path: str | Path, size: int | None = None
                        ) -> Path:  # fmt: skip
    """Draw :func:`kernels_figure` into a PNG at ``path``; returns the path."""
    return save(kernels_figure(results, size), path)


def write_prediction_chart(results: Mapping[str, Any], path: str | Path) -> Path:
    """Draw :func:`prediction_figure` into a PNG at ``path``; returns the path."""
    return save(prediction_figure(results), path)
