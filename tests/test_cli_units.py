"""Every numeric column of the tables the commands print says its unit in its header (ms, s,
MB, MiB, GB/s, samples/s, x, %, pp), or is a count or a loss named as such; the JSON keys behind
them stay as they were."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hipress.bench.tables import TABLES

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
UNITS = {"ms", "s", "MB", "MiB", "GB/s", "samples/s", "x", "%", "pp", "MB/step", "elements"}
# columns whose figures are counts or losses: no unit to give
UNITLESS = {"workers", "H", "compressed tensors", "compressed", "best epochs",
            "final valid loss", "valid loss", "train loss", "loss", "val loss", "val ppl"}  # fmt: skip
# the tables of the commands `hipress bench e2e|convergence|kernels|sync|plan` and `hipress demo`
COMMANDS = ("e2e", "convergence", "convergence-tabular", "convergence-fsdp",
            "convergence-fsdp-tabular", "kernels", "plan", "sync", "demo")  # fmt: skip
NUMBER = re.compile(r"[+-]?\d[\d,]*(\.\d+)?( \([^)]*\))?")


def has_unit(header: str) -> bool:
    words = set(header.replace("(", " ").replace(")", " ").split())
    return bool(words & UNITS) or header in UNITLESS


def unitless_columns(lines: list[str]) -> list[str]:
    """Headers of markdown-table columns with numbers and no unit, over every table in
    ``lines``."""
    bad: list[str] = []
    header: list[str] | None = None
    for line in lines:
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif not set(line) <= set("|-: "):
            for head, cell in zip(header, cells, strict=False):
                if NUMBER.fullmatch(cell) and not has_unit(head) and head not in bad:
                    bad.append(head)
    return bad


@pytest.mark.parametrize("name", COMMANDS)
def test_every_numeric_column_of_a_results_table_has_a_unit(name: str) -> None:
    lines = TABLES[name](json.loads((RESULTS / f"{name}.json").read_text()))
    assert any(line.startswith("|") for line in lines)
    assert unitless_columns(lines) == [], name


def test_the_checker_finds_a_column_without_a_unit() -> None:
    table = ["| run | samples/s | eff | wall s |", "|---|---:|---:|---:|", "| a | 1.0 | 0.5 | 3 |"]
    assert unitless_columns(table) == ["eff"]


def test_the_plain_text_tables_name_their_units() -> None:
    from hipress.bench.kernels import HEADER
    from hipress.bench.sync import format_table
    from hipress.timeline import BREAKDOWN, breakdown_markdown

    for unit in ("elements", "enc GB/s", "dec GB/s", "% roof", "torch enc GB/s", "copy GB/s",
                 "write GB/s", "dec/w x"):  # fmt: skip
        assert unit in HEADER
    sync = json.loads((RESULTS / "sync.json").read_text())
    text = format_table(sync)
    head = next(line for line in text.splitlines() if line.lstrip().startswith("size"))
    assert head.split()[2:] == ["ms", "x", "DDP", "sent", "%", "enc", "ms", "comm", "ms",
                                "dec", "ms"]  # fmt: skip
    assert "x " not in text.split(head)[1].split("\n")[1]  # the unit is in the header only
    md = breakdown_markdown([("mean", dict.fromkeys(BREAKDOWN, 1.0))]).splitlines()
    assert unitless_columns(md) == []
