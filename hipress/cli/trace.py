"""``hipress trace``: where the steps of a recorded timeline spend their time, and a PNG of it
(the trace files of ``CaSyncState.trace`` or ``hipress bench e2e``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

__all__ = ["add_parser"]


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
        print(f"ms per step over {next(iter(table['ranks'].values()))['steps']} step(s):\n")
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
