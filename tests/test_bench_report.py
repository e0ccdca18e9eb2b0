"""The reference results in docs/results/ and the docs' tables generated from them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hipress.bench.provenance import stamp
from hipress.bench.report import END, generated_tables, update_docs
from hipress.bench.tables import TABLES

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"


def test_the_committed_tables_are_what_the_generator_writes() -> None:
    stale = update_docs(RESULTS, ROOT / "docs", check=True)
    assert stale == [], f"run `hipress bench report`: stale tables {stale}"


def test_one_reference_result_per_benchmark_with_its_provenance() -> None:
    assert {p.stem for p in RESULTS.glob("*.json")} == set(TABLES)
    for path in RESULTS.glob("*.json"):
        data = json.loads(path.read_text())
        assert data["commit"] and data["command"], path
        assert data["machine"]["cpus"] and "cpu" in data["machine"], path


def test_a_stale_table_is_found_and_rewritten(tmp_path: Path) -> None:
    results = tmp_path / "results"
    shutil.copytree(RESULTS, results)
    doc = tmp_path / "bench.md"
    doc.write_text("intro\n\n" + "\n\n".join(generated_tables(results).values()) + "\n\nend\n")
    assert update_docs(results, doc, check=True) == []
    data = json.loads((results / "costfit.json").read_text())
    data["rows"][0]["median_error"] = 0.5
    (results / "costfit.json").write_text(json.dumps(data))
    before = doc.read_text()
    assert update_docs(results, doc, check=True) == ["costfit"]
    assert doc.read_text() == before  # --check writes nothing
    assert update_docs(results, doc) == ["costfit"]
    text = doc.read_text()
    assert "| terngrad | encode | piecewise | 0.500 |" in text
    assert text.startswith("intro\n\n") and text.endswith("\n\nend\n")
    assert update_docs(results, doc, check=True) == []


def test_a_result_without_a_table_or_a_table_without_a_result_is_an_error(
    tmp_path: Path,
) -> None:
    results = tmp_path / "results"
    shutil.copytree(RESULTS, results)
    tables = generated_tables(results)
    doc = tmp_path / "bench.md"
    doc.write_text("\n".join(t for name, t in tables.items() if name != "ring"))
    with pytest.raises(ValueError, match="no generated table for ring"):
        update_docs(results, doc, check=True)
    (results / "ring.json").unlink()
    doc.write_text("\n".join(tables.values()))
    with pytest.raises(ValueError, match=r"a generated table of ring, but no ring\.json"):
        update_docs(results, doc, check=True)
    (results / "nosuch.json").write_text("{}")
    with pytest.raises(ValueError, match="no table for a benchmark named 'nosuch'"):
        generated_tables(results)
    assert END.format(name="ring") in tables["ring"]


def test_stamp_records_commit_machine_and_command() -> None:
    got = stamp({"machine": {"device": "cpu"}}, "hipress bench kernels --reps 1")
    assert got["command"] == "hipress bench kernels --reps 1"
    assert got["machine"]["device"] == "cpu" and got["machine"]["cpus"] >= 1
    assert got["commit"] is None or len(got["commit"].split("+")[0]) == 40
    assert "created" in got
