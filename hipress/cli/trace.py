"""``hipress trace``: where the steps of a recorded timeline spend their time, and a PNG of it
(the trace files of ``CaSyncState.trace`` or ``hipress bench e2e``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

__all__ = ["add_parser"]


_BOUNDS = {
    "spans": "steps are the training loop's `step` spans",
    "optimizer": "steps run from one optimizer step's end to the next",
    "none": "no step boundaries in the trace (no optimizer step and no `step` span was "
    "recorded): step, exposed and other are not known (n/a); the rest is per CaSync step",
}


def _heading(rank: dict[str, Any]) -> str:
    """What the table's figures are per, and what the trace could not tell."""
    lines = [f"ms per step over {rank['steps']} step(s); {_BOUNDS[rank['bounds']]}"]
    if rank["left_out"]:
        lines.append("step 0 (compiling, warm-up, DDP's bucket rebuild) is left out")
    if rank["compute"] is None:
        lines.append(
            "no `compute` spans: compute and exposed are not known (n/a), and other holds "
            "forward, backward and the optimizer (mark them with "
            'tracer.span("forward", "compute") ...)'
        )
    return "\n".join(lines) + ":"


def _cmd_trace(args: argparse.Namespace) -> int:
    from hipress.timeline import (
        TimelineError,
        breakdown,
        breakdown_markdown,
        load_traces,
        render_png,
    )

    try:
        events = load_traces(args.files)
        table = breakdown(events)
        rows = [(f"rank {r}", row) for r, row in table["ranks"].items()]
        print(_heading(next(iter(table["ranks"].values()))) + "\n")
        print(breakdown_markdown([*rows, ("mean", table["mean"])]))
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(table, indent=1))
            print(f"\nwrote {args.json}")
        if args.png:
            print(f"wrote {render_png(events, args.png, title=args.title or '')}")
    except TimelineError as exc:
        raise SystemExit(f"hipress trace: {exc}") from exc
    return 0


def add_parser(sub: Any) -> None:
    """Add ``trace`` to the top-level group ``sub``."""
    t = sub.add_parser(
        "trace",
        help="a recorded step timeline: the breakdown per step, and a PNG",
        description="Read trace files (one per rank, Chrome trace-event JSON, as "
        "CaSyncState.trace and hipress bench e2e write them; Perfetto opens them too) and print "
        "where each step's time goes: compute, encode, decode, copies, exposed waits, the "
        "hook's Python overhead, the rest; work on other threads; time the network was busy.",
    )
    t.add_argument("files", nargs="+", metavar="TRACE", help="trace files (all ranks of a run)")
    t.add_argument("--png", metavar="OUT", help="render the timeline to this PNG")
    t.add_argument("--title", help="title of the PNG")
    t.add_argument("--json", metavar="OUT", help="write the breakdown as JSON")
    t.set_defaults(func=_cmd_trace)
