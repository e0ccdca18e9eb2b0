"""``hipress plan --algorithm powersgd``: rounds entries with each round's predicted ms and the
speedup against plain, the plan saved like others, typed refusals of single-round options."""

from __future__ import annotations

from pathlib import Path

import pytest

from hipress.cli import main
from hipress.core.plan import Plan, Strategy

MODEL = """
from torch import nn


def make():
    return nn.Sequential(nn.Linear(1024, 2048), nn.Linear(2048, 4))
"""


def test_plan_prices_the_rounds_against_plain(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    (tmp_path / "m.py").write_text(MODEL)
    model, saved = f"{tmp_path / 'm.py'}:make", tmp_path / "plan.json"
    args = ["plan", "--model", model, "--workers", "4", "--bandwidth", "100mbit",
            "--algorithm", "powersgd", "--param", "rank=2", "--budget", "0.3"]  # fmt: skip
    assert main([*args, "--out", str(saved)]) == 0
    out = capsys.readouterr().out
    lines = {ln.split()[0]: ln for ln in out.splitlines() if ln.strip()}
    assert "p ms + q ms + codec ms" in out and "speedup" in out
    assert lines["0.weight"].split()[1] == "rounds", out  # 8 MB at 100 Mbit/s: ~1 s plain
    assert lines["0.weight"].rstrip().endswith("x")
    assert "(1-D)" in lines["0.bias"]
    plan = Plan.load(saved)
    assert plan.lookup("0.weight").strategy is Strategy.ROUNDS
    assert plan.meta["rounds_prices"]["0.weight"]["speedup"] > 1
    assert f"plan saved to {saved}" in out
    assert main([*args, "--readiness", str(saved)]) == 2
    err = capsys.readouterr().err
    assert "--readiness applies to single-round algorithms, not the multi-round powersgd" in err
    assert main([*args[:-4], "--param", "rank=0"]) == 2
    assert "does not fit powersgd" in capsys.readouterr().err
