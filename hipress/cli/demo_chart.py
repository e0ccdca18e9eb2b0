"""The chart of ``hipress demo`` (:func:`write_chart`): training and validation loss per step,
bytes sent per step and final validation accuracy of every run, in one PNG."""

from __future__ import annotations

from pathlib import Path

from hipress.demo.config import DemoResult, RunResult
from hipress.demo.models import model_name

__all__ = ["write_chart"]

_TITLES = {
    "lstm": "word LSTM LM",
    "gpt": "GPT-2-style LM (tied embeddings)",
    "gpt-untied": "GPT-2-style LM (untied embeddings)",
}


def _smooth(values: list[float], window: int) -> list[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def write_chart(result: DemoResult, path: Path) -> bool:
    """Draw training loss per step and validation points of every run, bytes sent per step,
    and final validation accuracy into a PNG at ``path``. Returns False (and draws nothing) if
    matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    runs: list[RunResult] = result.runs
    fig, (ax_loss, ax_bytes, ax_acc) = plt.subplots(
        1, 3, figsize=(13, 4), gridspec_kw={"width_ratios": [2.2, 1, 1]}
    )
    colors = [f"C{i}" for i in range(len(runs))]
    window = max(1, len(runs[0].train_loss) // 30)
    for r, c in zip(runs, colors, strict=True):
        steps = range(1, len(r.train_loss) + 1)
        ax_loss.plot(steps, _smooth(r.train_loss, window), color=c, label=f"{r.spec.name} train")
        ax_loss.plot(
            [e.step for e in r.evals],
            [e.loss for e in r.evals],
            "o--",
            color=c,
            label=f"{r.spec.name} validation",
        )
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("next-token loss (nats)")
    ax_loss.set_title(f"loss ({window}-step moving average)")
    ax_loss.legend(fontsize=8)
    ax_loss.grid(alpha=0.3)
    names = [r.spec.name for r in runs]
    mib = [r.bytes_per_step / 2**20 for r in runs]
    bars = ax_bytes.bar(names, mib, color=colors)
    ax_bytes.bar_label(bars, labels=[f"{m:.2f}" for m in mib], fontsize=8)
    ax_bytes.set_ylabel("MiB sent per step per worker")
    ax_bytes.set_title("gradient bytes sent")
    acc = [100 * r.final.accuracy for r in runs]
    bars = ax_acc.bar(names, acc, color=colors)
    ax_acc.bar_label(bars, labels=[f"{a:.1f}%" for a in acc], fontsize=8)
    ax_acc.set_ylabel("validation next-token accuracy (%)")
    ax_acc.set_title(f"after {len(runs[0].train_loss)} steps")
    for ax in (ax_bytes, ax_acc):
        ax.tick_params(axis="x", labelsize=8, rotation=10)
    speeds = ", ".join(f"{r.spec.name} {r.samples_per_s:.0f} samples/s" for r in runs)
    fig.suptitle(
        f"hipress demo: {_TITLES[model_name(result.config.model)]} on Python stdlib source, "
        f"{result.config.workers} workers, "
        f"{result.network}\nthroughput: {speeds}",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
