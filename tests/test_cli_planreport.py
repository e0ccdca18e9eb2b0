"""What ``hipress plan`` says its plan rests on, its warning on far extrapolation, and plans
reproducible from a saved profile (:mod:`hipress.cli.planreport`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hipress.cli import main
from hipress.core.plan import Plan
from hipress.secopa.model.costfn import fit_piecewise
from hipress.secopa.model.profile import Profile


@pytest.fixture(scope="module")
def saved_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real ``hipress profile --out``, measured once (short budget, given link)."""
    path = tmp_path_factory.mktemp("profile") / "p.json"
    argv = ["profile", "--algorithm", "terngrad", "--bandwidth", "10gbit", "--budget", "0.3"]
    assert main([*argv, "--threads", "1", "--out", str(path)]) == 0
    return path


def test_a_saved_profile_gives_the_same_plan_every_time(
    saved_profile: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    argv = ["plan", "--model", "vgg19", "--workers", "64", "--profile", str(saved_profile)]
    outs, plans = [], []
    for _ in range(3):
        assert main(argv) == 0
        outs.append(capsys.readouterr().out)
        assert main([*argv, "--json"]) == 0
        plans.append(Plan.from_json(capsys.readouterr().out))
    assert outs[0] == outs[1] == outs[2]
    assert plans[0] == plans[1] == plans[2]
    assert len({p.digest() for p in plans}) == 1
    assert f"compute figures from {saved_profile}" in outs[0]


def test_the_plan_says_what_each_cost_rests_on(
    saved_profile: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    argv = ["plan", "--model", "mlp", "--workers", "8", "--profile", str(saved_profile)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "costs (largest tensor 2,097,152 elements):" in out
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    for op in ("encode", "decode", "merge"):
        assert "measured over 256 .. " in rows[op], rows[op]
    assert "given link (alpha-beta model, any size)" in rows["allreduce"]


def test_far_extrapolation_warns_by_how_much_and_how_to_measure_further(
    saved_profile: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prof = Profile.load(saved_profile)
    small = fit_piecewise([256.0, 4096.0, 65536.0], [0.01, 0.05, 0.6])
    cut = Profile.from_dict({**prof.to_dict(), "compute": {
        op: small.to_dict() for op in prof.compute}})  # fmt: skip
    path = tmp_path / "cut.json"
    cut.save(path)
    capsys.readouterr()
    argv = ["plan", "--model", "vgg19", "--workers", "64", "--profile", str(path)]
    assert main(argv) == 0
    cap = capsys.readouterr()
    assert "extrapolated 1,568x" in cap.out
    warning = next(x for x in cap.err.splitlines() if x.startswith("warning: encode"))
    assert "1,568x beyond the largest size measured (65,536 elements)" in warning
    assert "--budget " in warning and "hipress profile --model vgg19" in warning
    # the JSON output warns too (on stderr), and a covered model does not
    assert main([*argv, "--json"]) == 0
    assert "1,568x" in capsys.readouterr().err
    wide = fit_piecewise([256.0, 4096.0, 2.0**21], [0.01, 0.05, 20.0])
    covered = Profile.from_dict({**prof.to_dict(), "compute": {
        op: wide.to_dict() for op in prof.compute}})  # fmt: skip
    covered.save(path)
    assert main(["plan", "--model", "mlp", "--workers", "4", "--profile", str(path)]) == 0
    assert "warning" not in capsys.readouterr().err


def test_a_plan_chosen_by_exposed_time_prints_it_beside_the_sums(
    saved_profile: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    from hipress.cli.planreport import print_plan
    from hipress.core.plan import Strategy, TensorPlan

    entries = (TensorPlan("w", 1 << 20, True, Strategy.ALLGATHER, 1, 2.0, 5.0),)
    totals = {"planned": 2.0, "all_uncompressed": 5.0, "all_compressed": 2.0, "exposed": 0.4}
    plan = Plan("terngrad", {}, 4, entries, totals=totals)
    print_plan(plan, "m", Profile.load(saved_profile), sys.stdout)
    lines = capsys.readouterr().out.splitlines()
    exposed = next(x for x in lines if x.strip().startswith("exposed"))
    assert "0.400" in exposed and "waits for after backward" in exposed
    assert any("none hidden behind backward" in x for x in lines)
    print_plan(Plan("terngrad", {}, 4, entries, totals={"planned": 2.0}),
               "m", Profile.load(saved_profile), sys.stdout)  # fmt: skip
    assert "exposed" not in capsys.readouterr().out
