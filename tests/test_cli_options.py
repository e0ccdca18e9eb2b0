"""The conventions every ``hipress`` subcommand shares (:mod:`hipress.cli.options`): help on
every option, ``--version``, ``-v`` anywhere, one name per concept with the old spellings as
deprecated aliases, comma lists, ``check`` over many files, and progress on long steps."""

from __future__ import annotations

import argparse
import io
import time
from pathlib import Path

import pytest

import hipress
from hipress.cli import build_parser, main
from hipress.cli.casync import add_sync_arguments
from hipress.cli.options import walk
from hipress.cli.progress import Phase
from hipress.compll.algorithm import shipped_path


def _parser(path: tuple[str, ...]) -> argparse.ArgumentParser:
    p = build_parser()
    for name in path:
        sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
        p = sub.choices[name]
    return p


def test_every_option_of_every_subcommand_has_help() -> None:
    paths = [(), *walk(build_parser())]
    assert ("bench", "sync") in paths and ("plan",) in paths
    missing = [
        f"hipress {' '.join(path)} {a.option_strings or a.dest}"
        for path in paths
        for a in _parser(path)._actions
        if not isinstance(a, argparse._SubParsersAction) and not a.help
    ]
    assert missing == []


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"hipress {hipress.__version__}"


@pytest.mark.parametrize(
    "argv", [["-v", "algorithms", "-n", "8"], ["algorithms", "-n", "8", "-v"], ["algorithms"]]
)
def test_verbose_before_or_after_the_subcommand(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    assert args.verbose is ("-v" in argv)
    assert build_parser().parse_args(["bench", "report", "--verbose"]).verbose is True


def test_check_takes_many_files_like_a_linter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.cll"
    bad.write_text("this is not CompLL\n")
    good = [str(shipped_path("terngrad")), "onebit"]
    assert main(["check", *good]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in out] == good and all(": ok: " in x for x in out)
    assert main(["check", good[0], str(bad), "onebit"]) == 1
    cap = capsys.readouterr()
    assert len(cap.out.splitlines()) == 2  # the two good files still report
    assert str(bad) in cap.err and "1 of 3 file(s) failed" in cap.err


def test_old_spellings_still_work_and_warn_once_at_the_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["plan", "--model", "mlp", "--bandwidth", "1gbit", "--budget", "0.1", "--json"]
    assert main([*base, "--threads", "1", "--world-size", "4"]) == 0
    cap = capsys.readouterr()
    assert '"world_size": 4' in cap.out
    lines = cap.err.splitlines()
    assert lines[-1] == "hipress: warning: --world-size is deprecated; use --workers N"
    assert main([*base, "--threads", "1", "--workers", "4"]) == 0
    assert "deprecated" not in capsys.readouterr().err
    # the message names the spelling the user typed
    assert main(["plan", "--model", "mlp", "--world-size", "0", "--bandwidth", "1gbit"]) == 2
    assert "--world-size must be >= 1" in capsys.readouterr().err
    assert main(["plan", "--model", "mlp", "--workers", "0", "--bandwidth", "1gbit"]) == 2
    assert "--workers must be >= 1" in capsys.readouterr().err


def _sync(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_sync_arguments(p)
    return p.parse_args(argv)


def test_one_name_and_comma_lists_with_old_forms_as_aliases() -> None:
    new = _sync(["--workers", "2,4", "--sizes", "1K,64M", "--bandwidth", "loopback,1gbit"])
    old = _sync(["--world-sizes", "2", "4", "--sizes", "1K", "64M", "--rates", "loopback", "1000"])
    for args in (new, old):
        assert args.workers == [2, 4] and args.sizes == [1024, 64 << 20]
        assert args.rates == [None, 1000.0]
    assert not getattr(new, "deprecations", [])
    assert len(old.deprecations) == 3 and all("deprecated" in d for d in old.deprecations)
    with pytest.raises(SystemExit):
        _sync(["--strategies", "ps,tree"])
    # bench e2e, bench plan and demo: --bandwidth with units, old spellings converted
    e2e = build_parser().parse_args(["bench", "e2e", "--bandwidth", "100mbit,loopback"])
    assert e2e.rates == [100.0, None]
    assert build_parser().parse_args(["bench", "e2e", "--rates", "1g,none"]).rates == (1000.0, None)
    plan = build_parser().parse_args(["bench", "plan", "--workers", "3", "--bandwidth", "1gbit"])
    assert (plan.nproc, plan.rate_mbit) == (3, 1000.0)
    old_plan = build_parser().parse_args(["bench", "plan", "--nproc", "3", "--rate-mbit", "100"])
    assert (old_plan.nproc, old_plan.rate_mbit) == (3, 100.0)
    assert build_parser().parse_args(["demo", "--bandwidth", "loopback"]).net_mbit == 0.0
    assert build_parser().parse_args(["demo", "--net-mbit", "100"]).net_mbit == 100.0
    assert build_parser().parse_args(["profile", "--nproc", "3", "--out", "x"]).workers == 3


def test_progress_plain_lines_without_a_terminal() -> None:
    stream = io.StringIO()
    with Phase("timing terngrad", expect_s=1.0, stream=stream, bar=False, delay=0.05, every=0.05):
        time.sleep(0.3)
    lines = stream.getvalue().splitlines()
    assert len(lines) >= 3 and lines[0].startswith("hipress: timing terngrad ... 0 s (about 1 s)")
    assert lines[-1].startswith("hipress: timing terngrad: done in 0.")
    quiet = io.StringIO()
    with Phase("quick", stream=quiet, bar=False, delay=5.0):
        pass
    assert quiet.getvalue() == ""  # a step shorter than the delay shows nothing


def test_progress_bar_with_tqdm_and_plain_without(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("tqdm")
    stream = io.StringIO()
    with Phase("measuring", expect_s=0.2, stream=stream, bar=True, delay=0.01):
        time.sleep(0.4)
    assert "measuring: " in stream.getvalue() and "hipress:" not in stream.getvalue()
    import hipress.cli.progress as progress

    monkeypatch.setattr(progress, "_tqdm", lambda: None)  # as if tqdm were not installed
    plain = io.StringIO()
    with Phase("measuring", stream=plain, bar=True, delay=0.01, every=0.05):
        time.sleep(0.1)
    assert plain.getvalue().startswith("hipress: measuring ... ")
