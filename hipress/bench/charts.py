"""Charts a user would rather look at than read: a plan (:func:`plan_figure`: per tensor, how it
is synchronised and its predicted time), and the shared pieces of every chart (matplotlib is
optional: :func:`require` raises :class:`ChartError` naming the extra to install). The charts
of benchmark results are in :mod:`hipress.bench.charts_results`.

Every figure is a :class:`matplotlib.figure.Figure` built without ``pyplot`` (no global state,
no backend switched for the caller); :func:`save` writes it as a PNG.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hipress.core.plan import Plan, Strategy, TensorPlan

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["MAX_TENSORS", "ChartError", "plan_figure", "require", "save", "write_plan_chart"]

MISSING = "drawing charts needs matplotlib: pip install 'hipress[demo]'"
MAX_TENSORS = 40  # bars in a plan chart; a bigger plan shows its largest tensors
DPI = 110
SPREAD = 30  # a plan chart's time axis is logarithmic where its figures span more than this

# one colour per way a tensor is synchronised
COLORS = {
    Strategy.ALLREDUCE: "0.65",
    Strategy.ALLGATHER: "tab:blue",
    Strategy.PS: "tab:orange",
    Strategy.RING: "tab:green",
}


class ChartError(RuntimeError):
    """A chart that cannot be drawn: matplotlib is not installed, or the input is not what the
    chart reads (the message names which, and what to do)."""


def require() -> None:
    """Raise :class:`ChartError` unless matplotlib can be imported (check before long work)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ChartError(MISSING) from None


def new_figure(width: float, height: float) -> Figure:
    """An empty figure of ``width`` x ``height`` inches, drawn by Agg, outside pyplot."""
    require()
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def save(fig: Figure, path: str | Path) -> Path:
    """Write ``fig`` as a PNG at ``path`` (folders created); returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=DPI, format="png")
    return out


def _mb(numel: int) -> str:
    """The float32 gradient's size: ``12.3 KB``, ``8.39 MB``, ``205 MB``."""
    kb = 4 * numel / 1e3
    if kb < 100:
        return f"{kb:.3g} KB"
    return f"{kb / 1e3:.2f} MB" if kb < 1e4 else f"{kb / 1e3:.0f} MB"


def _shown(entries: Sequence[TensorPlan], limit: int) -> list[TensorPlan]:
    """The ``limit`` largest entries, in the plan's order."""
    if len(entries) <= limit:
        return list(entries)
    keep = {id(e) for e in sorted(entries, key=lambda e: e.numel, reverse=True)[:limit]}
    return [e for e in entries if id(e) in keep]


def _how(e: TensorPlan, kept: Mapping[str, str]) -> str:
    if not e.compress:
        return f"plain ({kept[e.name]})" if e.name in kept else "plain"
    text = f"{e.strategy.value} K={e.partitions}"
    return text + (f", <= {e.row_bound} of {e.rows} rows" if e.row_bound else "")


def _legend(s: Strategy) -> str:
    return "plain all-reduce" if s is Strategy.ALLREDUCE else f"compressed, {s.value}"


def _title(plan: Plan, model: str | None, shown: int) -> str:
    n = len(plan.entries)
    comp = sum(e.compress for e in plan.entries)
    params = f" {dict(plan.params)}" if plan.params else ""
    head = f"plan{f' of {model}' if model else ''}: {plan.algorithm}{params}, "
    head += f"{plan.world_size} workers, {comp} of {n} tensors compressed"
    t = plan.totals
    if t.get("planned") and t.get("all_uncompressed"):
        head += (f"\npredicted sync per step {t['planned']:.2f} ms "
                 f"(all uncompressed {t['all_uncompressed']:.2f} ms)")  # fmt: skip
    if shown < n:
        head += f"\nthe {shown} largest of {n} tensors"
    return head


def plan_figure(plan: Plan, model: str | None = None, limit: int = MAX_TENSORS) -> Figure:
    """One horizontal bar per tensor (the ``limit`` largest where there are more), in the
    plan's order: its predicted sync time as planned, coloured by how it is synchronised
    (plain all-reduce or a compressed strategy), labelled with the strategy and partitions K
    (the row bound of a row-sparse entry; for a plain one, the rule that kept it plain, from
    ``plan.meta["kept_plain"]``); a black tick marks the predicted time of its
    uncompressed alternative. A plan without predictions (the default rule's) shows each
    tensor's gradient size instead. The axis is logarithmic where the figures span more than
    :data:`SPREAD` times. Raises :class:`ChartError` for an empty plan or without
    matplotlib."""
    if not plan.entries:
        raise ChartError("the plan has no tensors: nothing to draw")
    entries = _shown(plan.entries, limit)
    timed = any(e.predicted_ms or e.uncompressed_ms for e in plan.entries)
    fig = new_figure(10, 1.6 + 0.3 * len(entries))
    ax = fig.subplots()
    y = list(range(len(entries)))
    values = [e.predicted_ms if timed else 4 * e.numel / 1e6 for e in entries]
    ax.barh(y, values, color=[COLORS[e.strategy] for e in entries], height=0.7)
    kept = dict(plan.meta.get("kept_plain") or {})
    for i, (e, v) in enumerate(zip(entries, values, strict=True)):  # right of bar and tick
        right = max(v, e.uncompressed_ms) if timed else v
        ax.text(right, i, f"  {_how(e, kept)}", va="center", fontsize=7)
    positive = [v for v in values + [e.uncompressed_ms for e in entries] if v > 0]
    if positive and max(positive) > SPREAD * min(positive):  # else the small bars vanish
        ax.set_xscale("log")
    if timed:
        ax.plot([e.uncompressed_ms for e in entries], y, "|", color="black", markersize=11,
                label="uncompressed alternative (predicted)")  # fmt: skip
    ax.set_yticks(y, [f"{e.name} ({_mb(e.numel)})" for e in entries], fontsize=7)
    ax.invert_yaxis()
    unit = "predicted sync time of the tensor (ms)" if timed else "gradient size (MB)"
    ax.set_xlabel(unit + (", log scale" if ax.get_xscale() == "log" else ""))
    ax.set_title(_title(plan, model, len(entries)), fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    ax.margins(x=0.25, y=0.01)
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    used = [s for s in COLORS if any(e.strategy is s for e in entries)]
    handles: list[Any] = [Patch(color=COLORS[s], label=_legend(s)) for s in used]
    if timed:
        handles.append(Line2D([], [], marker="|", color="black", linestyle="none",
                              markersize=11, label="uncompressed alternative"))  # fmt: skip
    fig.legend(handles=handles, fontsize=7, loc="outside lower center", ncols=len(handles))
    return fig


def write_plan_chart(
    plan: Plan, path: str | Path, model: str | None = None, limit: int = MAX_TENSORS
) -> Path:
    """Draw :func:`plan_figure` into a PNG at ``path``; returns the path."""
    return save(plan_figure(plan, model, limit), path)
