"""Reading step timelines (the trace files of :mod:`hipress.casync.trace`): where each step's
time goes (:func:`breakdown`), and a picture of it (:func:`render_png`).

The breakdown follows the hook's thread (the one that runs forward, backward and the
optimizer), where a step's time is spent one thing after another. A step is a ``step`` span
the training loop marks, else the time from one optimizer step's end to the next (the
``optimizer-step`` marks the tracer records); the process's first step (step 0: compiling,
warming up, DDP's bucket rebuild) is left out when others were recorded. A span's *own* time is
its duration less the spans nested in it, so every instant of the step counts once, under the
innermost phase:

- ``compute``: forward, backward and the optimizer (spans of category ``compute``, which the
  training loop marks), less CaSync's hook calls inside backward;
- ``encode``, ``decode``, ``copy``: CaSync's kernels and copies on that thread;
- ``wait``: the thread blocked on collectives: the communication left exposed;
- ``python``: the rest of the hook calls (issuing collectives, turns at the codec lock,
  bookkeeping);
- ``other``: the rest of the step (data, ``zero_grad``, logging; without ``compute`` spans
  also forward, backward and the optimizer).

``exposed`` is ``step - compute``: what synchronising costs the step. What the trace cannot
tell is ``None``: ``compute`` and ``exposed`` without ``compute`` spans; ``step``, ``exposed``
and ``other`` without step boundaries. Work on other threads
(decodes in the collectives' completion callbacks, the ring's thread) is reported apart
(``encode_all``, ``decode_all``): it is off the critical path but takes CPU from compute.
``network`` is the time at least one collective was in flight.
"""

from __future__ import annotations

import itertools
import json
import os
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from hipress.casync.stepmarks import OPTIMIZER_MARK

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
# the own-time columns that, with ``other``, add up to ``step``
_PARTS = ("compute", "encode", "decode", "copy", "wait", "python")
_OWN = {"compute": "compute", "encode": "encode", "decode": "decode", "copy": "copy",
        "wait": "wait", "hook": "python", "issue": "python", "lock": "python",
        }  # fmt: skip
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


def _step_bounds(events: list[dict[str, Any]]) -> tuple[str, list[tuple[float, float]]]:
    """One rank's steps as (start, end) µs: its ``step`` spans (``"spans"``), else the time
    between consecutive optimizer-step marks (``"optimizer"``; of several optimizer steps with
    no CaSync step between them, the last), else none (``"none"``)."""
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["cat"] == "step" and e["ph"] == "X"]
    if spans:
        return "spans", sorted(spans)
    marks = sorted(
        (e["ts"], e.get("name") == OPTIMIZER_MARK)
        for e in events
        if e["cat"] == "step" and e["ph"] == "i" and e.get("name") in (OPTIMIZER_MARK, "step-end")
    )
    casync = any(not is_opt for _, is_opt in marks)
    ends = [
        ts
        for i, (ts, is_opt) in enumerate(marks)
        if is_opt and not (casync and i + 1 < len(marks) and marks[i + 1][1])
    ]
    if len(ends) < 2:
        return "none", []
    return "optimizer", list(itertools.pairwise(ends))


def _first_step(events: list[dict[str, Any]]) -> float | None:
    """When the process's step 0 ended (its CaSync step-end mark), if recorded."""
    return next(
        (
            e["ts"]
            for e in events
            if e.get("name") == "step-end" and e.get("args", {}).get("step") == 0
        ),
        None,
    )


def _rank_row(evs: list[dict[str, Any]]) -> dict[str, Any]:
    """The breakdown of one rank's events (µs per step; see :func:`breakdown`)."""
    bounds, steps = _step_bounds(evs)
    first = _first_step(evs)
    kept = [b for b in steps if first is None or not b[0] <= first <= b[1]] or steps
    main = [e for e in evs if e["lane"] == "main" and e["ph"] == "X" and e["cat"] != "step"]
    if kept:  # only what happened inside the steps
        main = [e for e in main if any(a <= e["ts"] and e["ts"] + e["dur"] <= b for a, b in kept)]
    row: dict[str, Any] = dict.fromkeys(BREAKDOWN, 0.0)
    for cat, us in _own_times(main).items():
        if cat in _OWN:
            row[_OWN[cat]] += us
    n = len(kept) or sum(1 for e in evs if e.get("name") == "step-end") or 1
    if kept:
        row["step"] = sum(b - a for a, b in kept)
        row["other"] = row["step"] - sum(row[k] for k in _PARTS)
    else:
        row["step"] = row["other"] = None
    if not any(e["cat"] == "compute" for e in main):
        row["compute"] = None
    known = row["step"] is not None and row["compute"] is not None
    row["exposed"] = row["step"] - row["compute"] if known else None
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
    per_step = {k: None if v is None else v / 1e3 / n for k, v in row.items()}
    left_out = bool(kept) and first is not None and not any(a <= first <= b for a, b in kept)
    return per_step | {"steps": n, "left_out": int(left_out), "bounds": bounds}


def breakdown(events: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Milliseconds per step of each :data:`BREAKDOWN` column (see the module docstring),
    per rank (``ranks``: with ``steps`` counted, ``left_out`` 1 if step 0 was left out, ``bounds``
    where the steps come from: ``spans``, ``optimizer`` or ``none``) and their mean (``mean``;
    a column one rank cannot tell is ``None``). ``events``: :func:`load_traces`'s. Raises
    :class:`TimelineError` if there are none."""
    by_rank: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        by_rank[e.get("pid", 0)].append(e)
    if not by_rank:
        raise TimelineError("no spans in the trace")
    ranks = {
        str(rank): _rank_row(evs)
        for rank, evs in sorted(by_rank.items(), key=lambda kv: str(kv[0]))
    }
    mean: dict[str, float | None] = {}
    for k in BREAKDOWN:
        vals = [r[k] for r in ranks.values()]
        mean[k] = None if None in vals else sum(vals) / len(vals)
    return {"ranks": ranks, "mean": mean, "columns": list(BREAKDOWN)}


def _cell(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1f}"


def breakdown_markdown(rows: Sequence[tuple[str, dict[str, float]]]) -> str:
    """A markdown table of (label, :func:`breakdown` ``mean``) rows, ms per step (each header
    says so); what the trace cannot tell (``None``) is ``n/a``."""
    head = "| configuration | " + " | ".join(f"{k} ms" for k in BREAKDOWN) + " |"
    lines = [head, "|---|" + "---:|" * len(BREAKDOWN)]
    for label, row in rows:
        cells = " | ".join(_cell(row.get(k, 0.0)) for k in BREAKDOWN)
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
