"""Every option of the benchmarks, the demo, ``plan`` and ``profile`` is checked before any work
starts (:mod:`hipress.cli.checks`): a bad value ends the command as argparse does, status 2 and
one error line naming the option, the value and what is allowed, never a traceback."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hipress.cli import build_parser, main
from hipress.cli.checks import check_args, max_workers, subparser
from hipress.cli.checktable import RULES
from hipress.cli.options import walk

ROOT = Path(__file__).resolve().parent.parent
ERROR = re.compile(r"^hipress( [\w-]+)+: error: argument (--[\w-]+|profiles|[\w/]+): \S")

# what each command needs to parse at all (its required options), all valid
BASE: dict[tuple[str, ...], list[str]] = {
    ("plan",): ["--model", "mlp", "--workers", "4", "--bandwidth", "1gbit"],
    ("profile",): ["--out", "PROFILE_OUT"],
    ("bench", "ring"): ["PROFILE"],
}
# options the command checks itself, as early (hipress plan's own errors; ring's files below)
SELF = {
    ("plan",): (
        "--workers",
        "--world-size",
        "--profile",
        "--overlap",
        "--include",
        "--exclude",
        "--readiness",
    ),
    ("profile",): ("--overlap",),
    ("bench", "ring"): ("profiles",),
}
NUMBER = ["abc", "1e999", "nan", "-inf", "", "10" * 200]
RATE = ["abc", "-1gbit", "0mbit", "1e999gbit", "0.1bit", "5tbit"]
NAMES = ["abc", "onebit,abc", ","]
# model references refused before anything is imported: no such built-in, no such file, a
# call that does not parse, an argument that is not a literal, one given twice, ** arguments
MODELS = ["abc", "no-such-file.py:make", "torch.nn:Linear(3,", "torch.nn:Linear(n)",
          "torch.nn:Linear(a=1, a=1)", "torch.nn:Linear(**k)", "x:"]  # fmt: skip


def bad_values(tmp: Path) -> dict[tuple[str, ...], dict[str, list[str]]]:
    """Per command, per option: values that must be refused (besides the numeric ranges)."""
    not_dir = tmp / "a-file"
    not_dir.write_text("x")
    outs_dir = [str(not_dir), str(not_dir / "sub"), "/proc/hipress-results"]
    outs_file = [str(tmp), str(not_dir / "r.json"), "/proc/hipress.json", ""]
    plan_bad = ["no-such-plan.json", str(not_dir)]
    many = str(max_workers() + 1)
    return {
        ("bench", "kernels"): {
            "--device": ["x", *([] if torch.cuda.is_available() else ["cuda"])], "--sizes": ["abc", "-1", "0", "1e999", "1.5K", "2G", "1K,,x"], "--reps": ["-1", "0"],
            "--algorithms": NAMES[:2], "--out": outs_file,  # --algorithms "": all
        },
        ("bench", "sync"): {
            "--workers": ["1", many, "1000", "abc", "0"], "--sizes": ["abc", "-1", "1e999", "5"],
            "--algorithms": NAMES, "--strategies": ["tree"], "--partitions": ["0", "5000"],
            "--reps": ["-1"], "--budget": ["0", "-1", "nan"], "--bandwidth": RATE,
            "--threads": ["0", "100000"], "--backend": ["abc"], "--out": outs_file,
            "--world-sizes": ["1", "abc"], "--rates": ["abc", "-5", "1e999"],
        },
        ("bench", "e2e"): {
            "--workers": ["1", many], "--bandwidth": RATE, "--rates": ["abc", "1e999g"],
            "--models": NAMES, "--algorithms": NAMES, "--steps": ["0"],
            "--plan": [*plan_bad, "auto,default,auto", "default,no-such-plan.json"],
            "--include": ["embed weight", "a,x/y"],
            "--warmup": ["2", "-1"], "--repeats": ["0"], "--threads": ["0"],
            "--powersgd-rank": ["0"], "--fsdp-reshard": ["x"], "--out": outs_dir,
            "--name": ["", "a/b", ".."],
            "--local-steps": ["h0", "diloco-nosuch-h4", "postlocal-h4-f2-tau0", "x"],
            "--rows": ["abc", "none,abc"],
            "--bucket-cap-mb": ["abc", "0", "default,-1", "nan", "inf"],
        },
        ("bench", "convergence"): {
            "--workers": ["1", many], "--algorithms": ["abc", "onebit:fp32", "all,abc"],
            "--epochs": ["0"], "--task": ["x"], "--seeds": ["0"], "--train-tokens": ["0", "100"],
            "--train-samples": ["-1"], "--batch": ["0"], "--lr": ["0", "nan", "-1"],
            "--lr-schedule": ["x"], "--plan": plan_bad, "--threads": ["0"],
            "--include": ["embed weight"],
            "--warmup-steps": ["-1"], "--warmup-epochs": ["-1", "inf"],
            "--density-warmup-epochs": ["-1"], "--clip": ["-1", "nan"],
            "--fsdp-feedback": ["abc"], "--out": outs_dir,
            "--local-steps": ["h0", "diloco-nosuch-h4", "x"], "--local-epochs": ["0"],
            "--bandwidth": ["abc", "0mbit"],
            "--rows": ["abc", "none,abc"],
        },
        ("bench", "fsdp"): {
            "--workers": ["1", many], "--bandwidth": RATE, "--model": ["abc"],
            "--variants": ["abc", "onebit:abc", "onebit:none", ":fp32", ","], "--steps": ["0"],
            "--warmup": ["0"], "--repeats": ["0"], "--threads": ["0"], "--out": outs_dir,
            "--name": ["", "x/y"],
        },
        ("bench", "robustness"): {
            "--task": ["x"], "--workers": ["1", many], "--algorithms": NAMES,
            "--optimizers": ["abc", "sgd,abc"], "--steps": ["0"], "--threads": ["0"],
            "--out": outs_dir,
        },
        ("bench", "costfit"): {"--budget": ["0", "-1", "inf"], "--out": outs_file},
        ("bench", "ring"): {"--latency": ["abc", "-1us", "1e999s", "100s"], "--out": outs_file},
        ("bench", "report"): {"--results": [str(not_dir)], "--docs": [str(tmp / "none.md")]},
        ("bench", "plan"): {
            "--model": MODELS, "--algorithm": ["abc"], "--param": ["bitwidth=3", "nosuch=1"],
            "--backend": ["abc"], "--workers": ["1", many], "--nproc": ["1"], "--threads": ["0"],
            "--bandwidth": RATE, "--rate-mbit": ["-1", "abc"], "--steps": ["0"],
            "--warmup": ["-1"], "--budget": ["0", "nan"], "--plans": NAMES,
            "--strategies": ["abc", "allreduce"], "--json-out": outs_file,
        },
        ("plan",): {
            "--latency": ["abc", "1e999s"], "--algorithm": ["abc"], "--param": ["bitwidth=3"],
            "--backend": ["abc"], "--budget": ["0", "nan"], "--threads": ["0"],
            "--bandwidth": ["abc", "1e999gbit", "0gbit"], "--max-partitions": ["0"],
            "--strategies": ["ring,tree"], "--bucket-cap-mb": ["0", "nan"], "--out": outs_file,
            "--shapes": ["x"], "--row-density": ["abc", "nan", "1.5", "-0.1"], "--model": MODELS,
            "--png": outs_file,
        },
        ("profile",): {
            "--workers": ["1", many], "--nproc": ["1"], "--algorithm": ["abc"],
            "--param": ["bitwidth=3", "x=1"], "--backend": ["abc"], "--budget": ["-1"], "--threads": ["0"],
            "--bandwidth": ["abc"], "--latency": ["-1us"], "--out": outs_file, "--model": MODELS,
        },
        ("demo",): {
            "--workers": ["0", many], "--steps": ["0"], "--algorithm": ["abc"],
            "--param": ["bitwidth=3"], "--plan": plan_bad, "--bandwidth": RATE,
            "--net-mbit": ["-1", "abc"], "--model": ["x"], "--batch": ["0"],
            "--seq-len": ["1"], "--vocab": ["1"], "--emb-dim": ["0"], "--hidden": ["-1"],
            "--layers": ["0", "1000"], "--lr": ["0", "nan"], "--seed": ["-1"],
            "--threads": ["-1", "100000"], "--timeout": ["0", "inf"], "--out": outs_dir,
        },
    }  # fmt: skip


def _value_options(p: argparse.ArgumentParser) -> list[str]:
    return [
        next(o for o in a.option_strings if o.startswith("--"))
        for a in p._actions
        if a.option_strings and a.nargs != 0 and not isinstance(a, argparse._HelpAction)
    ] + [a.dest for a in p._actions if not a.option_strings and a.dest != "bench"]


def _argv(path: tuple[str, ...], tmp: Path, extra: list[str]) -> list[str]:
    base = [str(tmp / "profile.json") if a == "PROFILE" else a for a in BASE.get(path, [])]
    base = [str(tmp / "out.json") if a == "PROFILE_OUT" else a for a in base]
    return [*path, *base, *extra]


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one error line parsing and checking ``argv`` ends with (asserts status 2)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        assert exc.code == 2, argv
    else:
        assert check_args(parser, args, RULES) == 2, f"accepted: {argv}"
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if not ln.startswith(("usage:", " "))]
    assert len(lines) == 1 and ERROR.match(lines[0]), err
    return lines[0]


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hipress.secopa.model.profile import affine_profile

    d = tmp_path_factory.mktemp("flags")
    affine_profile("terngrad", encode=(2e-7, 0.02, 0.02), decode=(1e-7, 0.01, 0.01),
                   merge=(5e-8, 0.005, 0.005), bytes_per_element=0.25, header=16,
                   params={"bitwidth": 2}).save(d / "profile.json")  # fmt: skip
    return d


def test_every_value_option_has_a_rule_and_bad_values(profile: Path) -> None:
    parser = build_parser()
    bad = bad_values(profile)
    checked = [p for p in walk(parser) if p in RULES]
    assert {("bench", "sync"), ("bench", "e2e"), ("demo",), ("plan",)} <= set(checked)
    assert all(p in RULES for p in walk(parser) if p[0] == "bench" and len(p) == 2)
    for path in checked:
        opts = _value_options(subparser(parser, path))
        missing = [o for o in opts if o not in bad[path] and o not in SELF.get(path, ())]
        assert not missing, (path, missing)


def test_the_defaults_pass(profile: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # bench report's default folders
    parser = build_parser()
    for path in RULES:
        args = parser.parse_args(_argv(path, profile, []))
        assert check_args(parser, args, RULES) is None, path


def test_each_bad_value_is_a_usage_error_naming_the_flag(
    profile: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for path, options in bad_values(profile).items():
        for option, values in options.items():
            for value in values:
                line = refused(_argv(path, profile, [f"{option}={value}"]), capsys)
                assert f"argument {option}" in line or "argument --" in line, line


@pytest.mark.parametrize("path", [p for p in RULES if p != ("bench", "report")])
def test_numbers_out_of_range_and_garbage(
    path: tuple[str, ...], profile: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hipress.cli.checks import Int, Num

    parser = build_parser()
    sub = subparser(parser, path)
    for dest, rule in RULES[path].items():
        if not isinstance(rule, Int | Num) or dest in ("sizes", "rates", "net_mbit"):
            continue
        option = next(a.option_strings[-1] for a in sub._actions if a.dest == dest)
        hi = rule.hi() if callable(rule.hi) else rule.hi
        for value in [*NUMBER, str(rule.lo - 1), str(hi * 2 + 1)]:
            refused(_argv(path, profile, [f"{option}={value}"]), capsys)


def test_ring_profiles_must_load(profile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (profile / "junk.json").write_text("{")
    for name in ("none.json", "junk.json"):
        line = refused(["bench", "ring", str(profile / "profile.json"), str(profile / name)],
                       capsys)  # fmt: skip
        assert "argument profiles:" in line and name in line


def test_the_workers_bound_is_said(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(["bench", "sync", "--workers", "2,1000"], capsys)
    assert f"1000 is out of range (allowed: an integer from 2 to {max_workers()}" in line
    assert "network namespace each (at most 250)" in line


def test_casync_options_are_refused_in_the_fsdp_mode(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["bench", "convergence", "--fsdp", "--algorithms", "onebit"]
    line = refused([*base, "--include", "embed.weight"], capsys)
    assert "argument --include: 'embed.weight' is CaSync's, not the FSDP2 mode's" in line
    assert "argument --plan: 'auto' is CaSync's" in refused([*base, "--plan", "auto"], capsys)


def test_an_unwritable_out_fails_before_the_run(tmp_path: Path) -> None:
    """As the ``hipress`` command: status 2 at once, nothing run, no traceback."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    for argv in (["bench", "fsdp", "--workers", "2", "--out", str(blocker / "results")],):
        proc = subprocess.run([sys.executable, "-m", "hipress", *argv], capture_output=True,
                              text=True, timeout=120, check=False)  # fmt: skip
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr and proc.stdout == ""
        assert ERROR.match(proc.stderr.splitlines()[-1]), proc.stderr


def test_bench_kernels_in_process_does_not_run_the_caller_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setattr(os, "execv", lambda *a: pytest.fail(f"re-executed {a}"))
    out = tmp_path / "k.json"
    argv = ["bench", "kernels", "--device", "cpu", "--sizes", "1K", "--algorithms", "onebit",
            "--reps", "1", "--no-torch", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    assert "warning: hipress bench kernels times kernels with OpenMP's default active wait" in (
        capsys.readouterr().err
    )
    assert out.is_file()
    monkeypatch.setattr(sys, "argv", ["my-training-script.py"])
    assert main(argv) == 0  # argv None would be the caller's own arguments: still no re-run
