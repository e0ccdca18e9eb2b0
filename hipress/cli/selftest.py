"""``hipress selftest``: check this installation (:mod:`hipress.selftest`) and print the report."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from hipress.cli.args import RESULTS

__all__ = ["add_parser"]


def _cmd_selftest(args: argparse.Namespace) -> int:
    from hipress.selftest import print_report, run_selftest

    report = run_selftest(quick=args.quick, out=Path(args.out))
    if os.environ.get("RANK", "0") == "0" or not report.ok:
        print_report(report)
    return 0 if report.ok else 1


def add_parser(sub: Any) -> None:
    """Add ``selftest`` to the top-level group ``sub``."""
    t = sub.add_parser(
        "selftest",
        help="check this installation: kernels against the reference on this device, their "
        "speed, and (under torchrun) the DDP hook against plain DDP and hipress.fsdp's "
        "compressed reduce-scatter",
    )
    t.add_argument("--quick", action="store_true", help="smaller sizes (about a minute)")
    t.add_argument("--out", default=f"{RESULTS}/selftest.json",
                   help="where to write the report as JSON")  # fmt: skip
    t.set_defaults(func=_cmd_selftest)
