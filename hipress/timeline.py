"""Reading step timelines (the trace files of :mod:`hipress.casync.trace`): where each step's
time goes (:func:`breakdown`), and a picture of it (:func:`render_png`).

The breakdown follows the hook's thread (the one that runs forward, backward and the
optimizer), where a step's time is spent one thing after another. A span's *own* time is its
duration less the spans nested in it, so every instant of the step counts once, under the
innermost phase:

- ``compute``: forward, backward and the optimizer (spans of category ``compute``, which the
  training loop marks), less CaSync's hook calls inside backward;
- ``encode``, ``decode``, ``copy``: CaSync's kernels and copies on that thread;
- ``wait``: the thread blocked on collectives: the communication left exposed;
- ``python``: the rest of the hook calls (issuing collectives, turns at the codec lock,
  bookkeeping);
- ``other``: the rest of the step (data, ``zero_grad``, logging).

``exposed`` is ``step - compute``: what synchronising costs the step. Work on other threads
(decodes in the collectives' completion callbacks, the ring's thread) is reported apart
(``encode_all``, ``decode_all``): it is off the critical path but takes CPU from compute.
``network`` is the time at least one collective was in flight.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "BREAKDOWN",
    "TimelineError",
    "breakdown",
    "breakdown_markdown",
    "load_traces",
    "render_png",
]

#: The columns of :func:`breakdown`, in table order (milliseconds per step).
BREAKDOWN = (
    "step",
    "compute",
    "exposed",
    "encode",
    "decode",
    "copy",
    "wait",
    "python",
    "other",
    "encode_all",
    "decode_all",
    "network",
)
_OWN = {"compute": "compute", "encode": "encode", "decode": "decode", "copy": "copy",
        "wait": "wait", "hook": "python", "issue": "python", "lock": "python",
        "step": "other"}  # fmt: skip
_COLOURS = {
    "compute": "#9aa5b1",
    "hook": "#f2c14e",
    "encode": "#2a9d8f",
    "decode": "#e76f51",
    "copy": "#8e7dbe",
    "issue": "#f4a261",
    "wait": "#d62828",
    "lock": "#6d6875",
    "comm": "#457b9d",
    "step": "#ffffff",
}


class TimelineError(ValueError):
    """A trace file that cannot be read, or no events to work on."""


def load_traces(paths: Iterable[str | os.PathLike[str]]) -> list[dict[str, Any]]:
    """The events of every trace file in ``paths`` (Chrome trace-event JSON, as
    :class:`~hipress.casync.trace.Tracer` writes), lane names resolved: each event gets
    ``lane`` (its thread's name). Raises :class:`TimelineError` naming a bad file."""
    out: list[dict[str, Any]] = []
    for path in paths:
        try:
            doc = json.loads(Path(path).read_text())
            events = doc["traceEvents"] if isinstance(doc, dict) else doc
            if not isinstance(events, list):
                raise TypeError("traceEvents is not a list")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise TimelineError(f"{path}: not a trace file ({exc})") from exc
        names = {
            (e.get("pid"), e.get("tid")): e["args"]["name"]
            for e in events
            if e.get("ph") == "M" and e.get("name") == "thread_name"
        }
        for e in events:
            if e.get("ph") in ("X", "i"):
                out.append(
                    {**e, "lane": names.get((e.get("pid"), e.get("tid")), str(e.get("tid")))}
                )
    return out


def _own_times(spans: list[dict[str, Any]]) -> dict[str, float]:
    """Own time (µs) per category of ``spans`` (one lane; nested spans are subtracted from
    the span they are inside)."""
    own: dict[str, float] = defaultdict(float)
    stack: list[tuple[float, str]] = []  # (end, category) of the open spans
    last = 0.0
    for e in sorted(spans, key=lambda e: (e["ts"], -e.get("dur", 0.0))):
        start, end = e["ts"], e["ts"] + e.get("dur", 0.0)
        while stack and stack[-1][0] <= start:  # close what ended before this span
            stop, cat = stack.pop()
            own[cat] += max(stop - last, 0.0)
            last = max(last, stop)
        if stack:
            own[stack[-1][1]] += max(start - last, 0.0)
        last = start
        stack.append((min(end, stack[-1][0]) if stack else end, e["cat"]))
    while stack:
        stop, cat = stack.pop()
        own[cat] += max(stop - last, 0.0)
        last = max(last, stop)
    return own


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def _inside(e: dict[str, Any], outer: dict[str, Any]) -> bool:
    return outer["ts"] <= e["ts"] and e["ts"] + e["dur"] <= outer["ts"] + outer["dur"]


def _steps(events: list[dict[str, Any]]) -> int:
    """Steps in one rank's events: its ``step`` spans, else its step-end marks."""
    spans = sum(1 for e in events if e["cat"] == "step" and e["ph"] == "X")
    return spans or sum(1 for e in events if e["cat"] == "step") or 1


def breakdown(events: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Milliseconds per step of each :data:`BREAKDOWN` column (see the module docstring),
    per rank (``ranks``) and their mean (``mean``), with ``steps`` counted per rank.
    ``events``: :func:`load_traces`'s. Raises :class:`TimelineError` if there are none."""
    by_rank: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        by_rank[e.get("pid", 0)].append(e)
    if not by_rank:
        raise TimelineError("no spans in the trace")
    ranks: dict[str, dict[str, float]] = {}
    for rank, evs in sorted(by_rank.items(), key=lambda kv: str(kv[0])):
        steps = _steps(evs)
        main = [e for e in evs if e["lane"] == "main" and e["ph"] == "X"]
        step_spans = [e for e in main if e["cat"] == "step"]
        if step_spans:  # only what happened inside the marked steps
            main = [e for e in main if any(_inside(e, s) for s in step_spans)]
        own = _own_times(main)
        row = dict.fromkeys(BREAKDOWN, 0.0)
        for cat, us in own.items():
            if cat in _OWN:
                row[_OWN[cat]] += us
        row["step"] = sum(e["dur"] for e in step_spans) if step_spans else sum(own.values())
        row["exposed"] = row["step"] - row["compute"]
        lanes: dict[Any, list[dict[str, Any]]] = defaultdict(list)  # other threads, by thread
        for e in evs:
            if e["ph"] == "X" and e["lane"] != "main" and not e["lane"].startswith("network"):
                lanes[e["tid"]].append(e)
        off_main = [_own_times(spans) for spans in lanes.values()]
        for cat in ("encode", "decode"):
            row[f"{cat}_all"] = row[cat] + sum(own.get(cat, 0.0) for own in off_main)
        row["network"] = _union(
            [(e["ts"], e["ts"] + e["dur"]) for e in evs if e["cat"] == "comm" and e["ph"] == "X"]
        )
        ranks[str(rank)] = {k: v / 1e3 / steps for k, v in row.items()} | {"steps": steps}
    mean = {k: sum(r[k] for r in ranks.values()) / len(ranks) for k in BREAKDOWN}
    return {"ranks": ranks, "mean": mean, "columns": list(BREAKDOWN)}


def breakdown_markdown(rows: Sequence[tuple[str, dict[str, float]]]) -> str:
    """A markdown table of (label, :func:`breakdown` ``mean``) rows, ms per step."""
    head = "| configuration | " + " | ".join(BREAKDOWN) + " |"
    lines = [head, "|---|" + "---:|" * len(BREAKDOWN)]
    for label, row in rows:
        cells = " | ".join(f"{row.get(k, 0.0):.1f}" for k in BREAKDOWN)
        lines.append(f"| {label} | {cells} |")
    return "\n".join(lines)


def render_png(
    events: Sequence[dict[str, Any]], out: str | os.PathLike[str], title: str = ""
) -> Path:
    """Draw ``events`` as a timeline PNG at ``out``: one row per rank and thread (and per
    network lane), phases as coloured bars, time in ms from the first event. Needs
    matplotlib (``pip install 'hipress[demo]'``): raises :class:`TimelineError` without it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError as exc:
        raise TimelineError(
            "rendering a timeline needs matplotlib: pip install 'hipress[demo]'"
        ) from exc
    spans = [e for e in events if e["ph"] == "X" and e["cat"] != "step"]
    if not spans:
        raise TimelineError("no spans in the trace")
    t0 = min(e["ts"] for e in spans)
    order = {"main": 0, "completion": 1}
    rows = sorted(
        {(e.get("pid", 0), e["lane"]) for e in spans},
        key=lambda r: (str(r[0]), r[1].startswith("network"), order.get(r[1], 2), r[1]),
    )
    index = {r: i for i, r in enumerate(rows)}
    fig, ax = plt.subplots(figsize=(12, 0.45 * len(rows) + 1.4))
    depth: dict[tuple[Any, str], list[float]] = defaultdict(list)  # nesting: open span ends
    for e in sorted(spans, key=lambda e: (e["ts"], -e["dur"])):
        row = (e.get("pid", 0), e["lane"])
        stack = depth[row]
        while stack and stack[-1] <= e["ts"]:
            stack.pop()
        level = len(stack)
        stack.append(e["ts"] + e["dur"])
        height = max(0.8 - 0.18 * level, 0.25)
        ax.broken_barh(
            [((e["ts"] - t0) / 1e3, e["dur"] / 1e3)],
            (index[row] - height / 2, height),
            facecolors=_COLOURS.get(e["cat"], "#cccccc"),
            edgecolor="none",
        )
    ax.set_yticks(range(len(rows)), [f"rank {p} {lane}" for p, lane in rows])
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    if title:
        ax.set_title(title)
    used = sorted({e["cat"] for e in spans})
    ax.legend(
        handles=[Patch(color=_COLOURS.get(c, "#cccccc"), label=c) for c in used],
        loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=len(used), frameon=False,
    )  # fmt: skip
    fig.tight_layout()
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
