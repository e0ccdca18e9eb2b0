"""SIGTERM (or SIGINT) to a running benchmark, the demo or ``hipress profile``: the command ends with one line saying
so and status 128 + the signal, and leaves nothing behind: no worker process, no network
namespace, no temporary folder. Real commands, started as ``python -m hipress``, stopped once
their workers exist."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hipress.bench.netsim import list_namespaces, shaping_unavailable_reason

SHAPED = shaping_unavailable_reason() is None


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(entry.name))
    return kids


def descendants(pid: int) -> set[int]:
    """Every live process under ``pid`` (its children, theirs, ...)."""
    kids, out, todo = _children(), set(), [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.add(k)
            todo.append(k)
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _workers(pid: int) -> set[int]:
    """The worker processes under ``pid``: spawned ones (``spawn_main``) and those a
    forkserver forked (its children: the helpers are the command's own children)."""
    found = set()
    for d in descendants(pid):
        try:
            cmd = Path(f"/proc/{d}/cmdline").read_bytes()
            ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        if b"spawn_main" in cmd or (b"forkserver" in cmd and ppid != pid):
            found.add(d)
    return found


def stop_when_running(
    argv: list[str], tmp: Path, want: int, sig: int = signal.SIGTERM, namespaces: bool = False
) -> tuple[subprocess.CompletedProcess[str], set[int]]:
    """Start ``hipress ARGV`` (its temporary files under ``tmp``), wait until ``want`` worker
    processes (and with ``namespaces``, its network namespaces) exist, send ``sig``; returns the
    finished process and every process that ran under it."""
    env = {**os.environ, "TMPDIR": str(tmp), "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.Popen([sys.executable, "-m", "hipress", *argv], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    seen: set[int] = set()
    deadline = time.monotonic() + 180  # (a heavily loaded machine: minutes to import torch)
    ready = False
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            seen |= descendants(proc.pid)
            ready = len(_workers(proc.pid)) >= want
            if ready and (not namespaces or list_namespaces(f"hpns-{proc.pid}")):
                break
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate()
        assert ready, f"{argv[:2]}: {want} workers not started within 180 s"
        time.sleep(0.5)  # inside the workers' setup: rendezvous, first steps
        seen |= descendants(proc.pid)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), seen


def assert_clean(done: subprocess.CompletedProcess[str], seen: set[int], tmp: Path, sig: int,
                 command: str) -> None:  # fmt: skip
    assert done.returncode == 128 + sig, done.stderr
    name = signal.Signals(sig).name
    assert done.stderr.splitlines()[-1].startswith(f"{command}: stopped by {name}"), done.stderr
    assert "Traceback" not in done.stderr
    deadline = time.monotonic() + 10  # the forkserver notices its parent's end
    while time.monotonic() < deadline and any(_alive(p) for p in seen):
        time.sleep(0.1)
    assert not [p for p in seen if _alive(p)], "processes left behind"
    # torch's compile cache (torchinductor_USER) is a lasting cache any run of torch makes
    left = [p.name for p in tmp.iterdir() if not p.name.startswith("torchinductor_")]
    assert not left, f"temporary files left: {left}"


# the launchers: netsim's forkserver on shaped links (bench fsdp), the same on loopback (bench
# sync; bench e2e stopped in its one-process compute-only run), the demo's spawned workers on
# shaped links, SeCoPa's local gloo group (profile, measuring the network); run side by side.
# Each: argv, signal, whether to wait for its network namespaces, workers to wait for
CASES = {
    "hipress bench fsdp": (
        ["bench", "fsdp", "--workers", "2", "--bandwidth", "1gbit", "--variants", "onebit:fp32",
         "--steps", "100000", "--warmup", "1"], signal.SIGTERM, True, 2),
    "hipress bench sync": (
        ["bench", "sync", "--workers", "2", "--sizes", "64M", "--algorithms", "onebit",
         "--strategies", "ps", "--partitions", "1", "--reps", "10000", "--budget", "600"],
        signal.SIGINT, False, 2),
    "hipress bench e2e": (
        ["bench", "e2e", "--workers", "2", "--bandwidth", "1gbit", "--models", "lstm-lm",
         "--algorithms", "onebit", "--steps", "100000", "--warmup", "3", "--repeats", "1",
         "--no-trace"], signal.SIGTERM, False, 1),
    "hipress demo": (
        ["demo", "--workers", "2", "--steps", "100000", "--bandwidth", "1gbit", "--plan",
         "default", "--no-chart", "--no-trace", "-q"], signal.SIGTERM, True, 2),
    "hipress profile": (
        ["profile", "--algorithm", "onebit", "--workers", "2"], signal.SIGTERM, False, 2),
}  # fmt: skip
FILE_OUT = ("hipress bench sync", "hipress profile")  # --out names a file, not a folder


def _left_namespaces(before: set[str]) -> list[str]:
    """Namespaces made since ``before`` whose command (the pid in the name) has ended: other
    commands running on the machine meanwhile keep theirs."""
    return [n for n in set(list_namespaces()) - before if not _alive(int(n.split("-")[1]))]


@pytest.mark.skipif(not SHAPED, reason=f"needs network namespaces: {shaping_unavailable_reason()}")
def test_a_signal_stops_each_launcher_and_leaves_nothing_behind(tmp_path: Path) -> None:
    before = set(list_namespaces())

    def one(command: str) -> tuple[subprocess.CompletedProcess[str], set[int], Path]:
        argv, sig, shaped, want = CASES[command]
        d = tmp_path / command.split()[-1]
        (d / "tmp").mkdir(parents=True)
        out = ["--out", str(d / "out.json" if command in FILE_OUT else d / "out")]
        return (*stop_when_running([*argv, *out], d / "tmp", want, sig, shaped), d)

    with ThreadPoolExecutor(len(CASES)) as pool:
        done = dict(zip(CASES, pool.map(one, CASES), strict=True))
    for command, (proc, seen, d) in done.items():
        assert_clean(proc, seen, d / "tmp", CASES[command][1], command)
        assert not (d / "out.json").exists() and not (d / "out" / "demo.json").exists()
        assert not list((d / "out").glob("*.json")), command  # no partial results
    # the phase the signal cut short says so, not "done"
    assert "measuring the network in a local group of 2 processes: done" \
        not in done["hipress profile"][0].stderr  # fmt: skip
    assert not _left_namespaces(before), "network namespaces left behind"
