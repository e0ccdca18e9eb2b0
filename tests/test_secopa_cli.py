"""``hipress plan`` / ``hipress profile``: parsing, tables, JSON output and user errors."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from hipress.cli import main
from hipress.cli.args import parse_bandwidth, parse_latency, parse_param
from hipress.core.plan import Plan
from hipress.secopa.model.profile import Profile, affine_profile
from hipress.secopa.model.specs import resolve_model


@pytest.fixture
def profile_file(tmp_path: Path) -> Path:
    path = tmp_path / "profile.json"
    affine_profile(
        "terngrad",
        encode=(2e-7, 0.02, 0.02),
        decode=(1e-7, 0.01, 0.01),
        merge=(5e-8, 0.005, 0.005),
        bytes_per_element=0.25,
        header=16,
        params={"bitwidth": 2},
    ).save(path)
    return path


@pytest.mark.parametrize(
    ("text", "bytes_per_s"),
    [
        ("10gbit", 1.25e9),
        ("10Gbps", 1.25e9),
        ("100mbit/s", 12.5e6),
        ("25Gb/s", 3.125e9),
        ("1.25GB/s", 1.25e9),
        ("400MB/s", 4e8),
    ],
)
def test_bandwidth_units(text: str, bytes_per_s: float) -> None:
    assert parse_bandwidth(text) == pytest.approx(bytes_per_s)


@pytest.mark.parametrize("text", ["fast", "10", "-1gbit", "10 furlongs", "0gbit"])
def test_bad_bandwidth_says_how_to_write_it(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"e\.g\. 10gbit"):
        parse_bandwidth(text)


def test_latency_and_param_parsing() -> None:
    assert parse_latency("25us") == pytest.approx(25e-6)
    assert parse_latency("0.1ms") == pytest.approx(1e-4)
    assert parse_latency("2e-5s") == pytest.approx(2e-5)
    with pytest.raises(argparse.ArgumentTypeError):
        parse_latency("5 parsecs")
    assert parse_param("bitwidth=2") == ("bitwidth", 2)
    assert parse_param("ratio=0.01") == ("ratio", 0.01)
    assert parse_param("stochastic=false") == ("stochastic", False)
    assert parse_param("mode=fast") == ("mode", "fast")


def test_plan_table_for_a_large_cluster(profile_file: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    argv = ["plan", "--model", "bert-base", "--world-size", "1024", "--bandwidth", "10gbit"]
    assert main([*argv, "--profile", str(profile_file)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == [
        "parameter",
        "elements",
        "decision",
        "strategy",
        "K",
        "pred",
        "ms",
        "plain",
        "ms",
    ]
    for name, _ in resolve_model("bert-base").params:
        assert any(line.startswith(name + " ") for line in lines), name
    assert "N = 1024" in out and "link 10 Gbit/s, 25 us latency" in out
    for key in ("planned", "all_uncompressed", "all_compressed"):
        assert any(line.strip().startswith(key) for line in lines)


def test_plan_json_and_saved_plan_agree(profile_file: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out_file = tmp_path / "plan.json"
    argv = [
        "plan",
        "--model",
        "resnet50",
        "--world-size",
        "64",
        "--bandwidth",
        "25gbit",
        "--latency",
        "10us",
        "--profile",
        str(profile_file),
        "--out",
        str(out_file),
        "--json",
    ]
    assert main(argv) == 0
    printed = Plan.from_json(capsys.readouterr().out)
    saved = Plan.load(out_file)
    assert printed == saved and printed.world_size == 64
    printed.check_matches(resolve_model("resnet50").named_numels())


def test_plan_measures_compute_when_no_profile_is_given(capsys) -> None:  # type: ignore[no-untyped-def]
    argv = [
        "plan",
        "--model",
        "mlp",
        "--world-size",
        "8",
        "--bandwidth",
        "1gbit",
        "--algorithm",
        "fp16",
        "--budget",
        "0.2",
        "--threads",
        "1",
        "--json",
    ]
    assert main(argv) == 0
    plan = Plan.from_json(capsys.readouterr().out)
    assert plan.algorithm == "fp16" and len(plan.entries) == 8


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--model", "mlp", "--world-size", "4"], "give --bandwidth"),
        (["--model", "mlp", "--world-size", "0", "--bandwidth", "1gbit"], "--world-size must"),
        (
            [
                "--model",
                "mlp",
                "--world-size",
                "4",
                "--latency",
                "5us",
                "--bandwidth",
                "1gbit",
                "--algorithm",
                "onebit",
                "--profile",
                "PROFILE",
            ],
            "profile is for terngrad",
        ),
        (
            ["--model", "mlp", "--world-size", "4", "--latency", "5us", "--profile", "PROFILE"],
            "--latency needs --bandwidth",
        ),
        (
            ["--model", "mlp", "--world-size", "4", "--profile", "/nonexistent/p.json"],
            "cannot read profile",
        ),
    ],
)
def test_user_errors_exit_2_with_a_message(
    extra: list[str],
    message: str,
    profile_file: Path,
    capsys,  # type: ignore[no-untyped-def]
) -> None:
    argv = ["plan", *[str(profile_file) if a == "PROFILE" else a for a in extra]]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err


def test_an_unknown_model_is_a_usage_error_before_any_work(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["plan", "--model", "resnet51", "--workers", "4", "--bandwidth", "1gbit"]) == 2
    err = capsys.readouterr().err
    assert "argument --model: 'resnet51' is not a built-in model (allowed: bert-base" in err


def test_profile_with_a_given_link(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out_file = tmp_path / "p.json"
    argv = [
        "profile",
        "--algorithm",
        "fp16",
        "--bandwidth",
        "10gbit",
        "--budget",
        "0.2",
        "--threads",
        "1",
        "--out",
        str(out_file),
    ]
    assert main(argv) == 0
    prof = Profile.load(out_file)
    assert prof.algorithm == "fp16" and prof.payload.bytes_per_element == 2.0
    assert "allreduce" in capsys.readouterr().out


def test_options_override_and_contradict_the_profile(profile_file: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    base = ["plan", "--model", "mlp", "--world-size", "4", "--profile", str(profile_file)]
    assert main([*base, "--bandwidth", "1gbit", "--overlap", "0", "--json"]) == 0
    assert Plan.from_json(capsys.readouterr().out).meta["overlap"] == 0.0
    assert main([*base, "--param", "bitwidth=4"]) == 2
    assert "--param {'bitwidth': 4} but the profile was measured with" in capsys.readouterr().err
    assert main([*base, "--overlap", "1.5"]) == 2
    assert "overlap must be in [0, 1]" in capsys.readouterr().err
