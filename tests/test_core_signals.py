"""hipress.core.signals: a signal while the forkserver imports is acted on at once, and the
real starts afterwards are held back for the starts alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

CHILD = textwrap.dedent(
    """
    import multiprocessing, sys
    from hipress.core.signals import deferred_signals, ready_forkserver

    def work():
        pass

    if __name__ == "__main__":
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["slow_import"])
        print("ready?", flush=True)
        ready_forkserver(ctx)
        print("ready", flush=True)
        with deferred_signals():
            p = ctx.Process(target=work)
            p.start()
        p.join()
        print("done", p.exitcode, flush=True)
    """
)


def _run(tmp_path: Path, sleep_s: float) -> subprocess.Popen[bytes]:
    """The child above, its forkserver importing a module that sleeps ``sleep_s``; output in
    files (the forkserver inherits them and may outlive the child)."""
    (tmp_path / "slow_import.py").write_text(f"import time\ntime.sleep({sleep_s})\n")
    (tmp_path / "child.py").write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    with open(tmp_path / "out", "wb") as out, open(tmp_path / "err", "wb") as err:
        return subprocess.Popen([sys.executable, str(tmp_path / "child.py")], cwd=tmp_path,
                                env=env, stdout=out, stderr=err)  # fmt: skip


def test_a_signal_while_the_forkserver_imports_stops_the_program(tmp_path: Path) -> None:
    proc = _run(tmp_path, 20.0)  # an import longer than the wait below
    deadline = time.monotonic() + 60
    while "ready?" not in (tmp_path / "out").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    # held back until the import ended (the old behaviour), it would end after 20 s
    assert proc.wait(timeout=15) == -signal.SIGTERM
    assert (tmp_path / "out").read_text() == "ready?\n"
    assert "Traceback" not in (tmp_path / "err").read_text()


def test_workers_start_once_the_forkserver_is_ready(tmp_path: Path) -> None:
    proc = _run(tmp_path, 0.2)
    assert proc.wait(timeout=120) == 0, (tmp_path / "err").read_text()
    assert (tmp_path / "out").read_text() == "ready?\nready\ndone 0\n"
