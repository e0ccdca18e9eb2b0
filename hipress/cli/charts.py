"""``hipress chart``: draw a saved plan or a benchmark's JSON as a PNG (:mod:`hipress.bench.charts`),
and :func:`chart_next_to`, with which ``hipress bench kernels`` and ``hipress demo`` draw theirs
next to their JSON."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from hipress.core.plan import Plan

__all__ = ["KINDS", "add_parser", "chart_next_to", "check_png", "draw", "write_plan_png"]

SKIPPED = "chart skipped: {why}"


def _read(path: Path) -> str:
    from hipress.bench.charts import ChartError

    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ChartError(f"cannot read {path}: {exc.strerror or exc}") from None


def _plan(path: Path, png: Path) -> Path:
    from hipress.bench.charts import ChartError, write_plan_chart
    from hipress.core.plan import Plan, PlanError

    try:
        plan = Plan.from_json(_read(path))
    except PlanError as exc:
        raise ChartError(f"{path}: {exc}") from None
    return write_plan_chart(plan, png)


def _results(writer: str) -> Callable[[Path, Path], Path]:
    def draw(path: Path, png: Path) -> Path:
        from hipress.bench import charts_results
        from hipress.bench.charts import ChartError

        try:
            results = json.loads(_read(path))
        except json.JSONDecodeError as exc:
            raise ChartError(f"{path} is not JSON: {exc}") from None
        if not isinstance(results, dict):
            raise ChartError(f"{path} holds no JSON object")
        return getattr(charts_results, writer)(results, png)

    return draw


# what each kind reads, and how it is drawn
KINDS: dict[str, tuple[str, Callable[[Path, Path], Path]]] = {
    "plan": ("a plan file (hipress plan --out)", _plan),
    "kernels": ("hipress bench kernels' JSON", _results("write_kernels_chart")),
    "prediction": (
        "hipress bench plan's or hipress demo's JSON",
        _results("write_prediction_chart"),
    ),
}


def draw(kind: str, path: str | Path, png: str | Path) -> Path:
    """Draw the ``kind`` chart of the file at ``path`` into ``png``; returns the PNG's path.
    Raises :class:`~hipress.bench.charts.ChartError` naming the file where it cannot."""
    return KINDS[kind][1](Path(path), Path(png))


def chart_next_to(kind: str, path: str | Path, png: str | Path, out: TextIO) -> Path | None:
    """Draw the ``kind`` chart of ``path`` into ``png``; print why on ``out`` and return None
    where it cannot (matplotlib not installed, or a result it cannot read): the results are
    written already, a chart is an extra."""
    from hipress.bench.charts import ChartError

    try:
        return draw(kind, path, png)
    except ChartError as exc:
        print(SKIPPED.format(why=exc), file=out)
        return None


def check_png(flag: str, value: Any, args: argparse.Namespace) -> None:
    """The rule of a ``--png FILE`` option (:mod:`hipress.cli.checktable`): a file that can be
    written, and matplotlib installed, before any work starts."""
    from hipress.bench.charts import ChartError, require
    from hipress.cli.checks import UsageError, check_out

    check_out(flag, value, "file")
    if value is not None:
        try:
            require()
        except ChartError:
            raise UsageError(flag, value, "needs matplotlib", "pip install 'hipress[demo]'"
                             ) from None  # fmt: skip


def write_plan_png(png: str | None, plan: Plan, model: str, out: TextIO) -> None:
    """``hipress plan --png``: draw ``plan`` into ``png`` (nothing where ``png`` is None) and
    say so on ``out``, or why not."""
    from hipress.bench.charts import ChartError, write_plan_chart

    if png is not None:
        try:
            print(f"wrote {write_plan_chart(plan, png, model)}", file=out)
        except ChartError as exc:
            print(SKIPPED.format(why=exc), file=out)


def _cmd_chart(args: argparse.Namespace) -> int:
    from hipress.bench.charts import ChartError

    png = Path(args.out) if args.out else Path(args.file).with_suffix(".png")
    try:
        print(f"wrote {draw(args.kind, args.file, png)}")
    except ChartError as exc:
        print(f"hipress chart: {exc}", file=sys.stderr)
        return 2
    return 0


def add_parser(sub: Any) -> None:
    """Add ``chart`` to the top-level group ``sub``."""
    kinds = "; ".join(f"{k}: {what}" for k, (what, _) in KINDS.items())
    c = sub.add_parser(
        "chart",
        help="draw a plan, or a benchmark's results, as a PNG",
        description=f"Draw a saved file as a PNG chart ({kinds}). Needs matplotlib "
        "(pip install 'hipress[demo]').",
    )
    c.add_argument("kind", choices=tuple(KINDS), help="what the file holds")
    c.add_argument("file", help="the plan or results file")
    c.add_argument("-o", "--out", metavar="PNG", help="the PNG to write (default: FILE.png)")
    c.set_defaults(func=_cmd_chart)
