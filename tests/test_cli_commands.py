"""Every ``hipress`` subcommand is registered, its module imports, and ``--help`` works."""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import subprocess
import sys

import pytest

import hipress
import hipress.cli
from hipress.cli import build_parser, main

COMMANDS = (
    "check",
    "show",
    "algorithms",
    "build",
    "selftest",
    "plan",
    "profile",
    "demo",
    "trace",
    "chart",
    "bench",
)
BENCHES = ("kernels", "plan", "sync", "e2e", "convergence", "costfit", "ring", "report", "fsdp",
           "robustness")  # fmt: skip
MODULES = sorted(m.name for m in pkgutil.iter_modules(hipress.cli.__path__, "hipress.cli."))


def _group(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_subcommand_is_registered() -> None:
    top = _group(build_parser())
    assert set(top) == set(COMMANDS)
    assert set(_group(top["bench"])) == set(BENCHES)


def test_a_broken_subcommand_module_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import hipress.cli.commands as cli_main

    monkeypatch.setitem(sys.modules, "hipress.cli.demo", None)  # as if its import failed
    monkeypatch.delattr(hipress.cli, "demo")
    try:
        with pytest.raises(ImportError):
            importlib.reload(cli_main)
    finally:
        monkeypatch.undo()
        importlib.reload(cli_main)


@pytest.mark.parametrize("module", MODULES)
def test_every_cli_module_imports(module: str) -> None:
    importlib.import_module(module)


@pytest.mark.parametrize(
    "argv", [[c] for c in COMMANDS] + [["bench", b] for b in BENCHES], ids=" ".join
)
def test_help_of_every_subcommand(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--help"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: hipress {' '.join(argv)}")


def test_console_entry_points_run() -> None:
    # ``python -m hipress`` and the ``hipress`` script both reach hipress.cli.commands.main
    r = subprocess.run([sys.executable, "-m", "hipress", "bench", "--help"],
                       capture_output=True, text=True, check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr
    for name in BENCHES:
        assert name in r.stdout


@pytest.mark.parametrize("flag", ["-V", "--version"])
def test_version_flags_print_the_version(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([flag])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"hipress {hipress.__version__}\n"


@pytest.mark.parametrize(
    "argv", [["algorithms"], ["show", "onebit"], ["plan", "--model", "mlp", "--workers", "4",
                                                  "--bandwidth", "1gbit", "--budget", "0.1",
                                                  "--threads", "1", "--json"]],
    ids=" ".join,
)  # fmt: skip
def test_output_into_a_closed_pipe_ends_quietly(argv: list[str]) -> None:
    from hipress.cli.commands import EXIT_BROKEN_PIPE

    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line, as `| head` is after it
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.run([sys.executable, "-m", "hipress", *argv], stdout=write,
                          stderr=subprocess.PIPE, text=True, env=env, check=False)  # fmt: skip
    os.close(write)
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
    assert proc.returncode == EXIT_BROKEN_PIPE
