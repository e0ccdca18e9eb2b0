"""``hipress bench sync`` end to end, in its smallest form."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from hipress.cli import main
from hipress.cli.casync import _size, add_sync_arguments


def test_bench_sync_quick_writes_a_table_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sync.json"
    argv = ["bench", "sync", "--quick", "--world-sizes", "2", "--sizes", "4K", "--algorithms"]
    argv += ["terngrad", "--partitions", "1", "--out", str(out)]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "terngrad/ps/K1" in table and "ddp_allreduce" in table
    rows = json.loads(out.read_text())["rows"]
    methods = {r["method"] for r in rows}
    assert methods == {
        "ddp_allreduce",
        "fp16_allreduce",
        "terngrad/allgather/K1",
        "terngrad/ps/K1",
        "terngrad/ring/K1",
    }
    for r in rows:
        assert r["world_size"] == 2 and r["bytes"] == 4096 and r["ms"] > 0
    for method in ("terngrad/ps/K1", "terngrad/ring/K1"):
        row = next(r for r in rows if r["method"] == method)
        assert 0 < row["ratio"] < 0.25 and row["speedup"] > 0 and row["comm_ms"] > 0


def test_sizes_and_bad_options() -> None:
    assert [_size(s) for s in ("1K", "256KB", "64M", "4096")] == [1024, 262144, 64 << 20, 4096]
    for bad in ("3", "1X", "-4K"):
        with pytest.raises(argparse.ArgumentTypeError):
            _size(bad)
    parser = argparse.ArgumentParser()
    add_sync_arguments(parser)
    args = parser.parse_args(["--world-sizes", "1"])
    from hipress.cli.casync import run_bench_sync

    assert run_bench_sync(args) == 2
