"""Run a function on N local worker processes joined in a gloo process group, and never hang.

    results = launch(work, 2, (corpus, config), timeout=900)   # work(rank, world_size, *args)

Workers are spawned with ``torch.multiprocessing`` (fresh interpreters), rendezvous through a
TCPStore the parent hosts on a port the OS picks (127.0.0.1), and run ``fn`` with the default
process group initialised. The parent polls them: when one fails, the others get a few seconds
to exit and are then stopped, and :class:`~hipress.demo.config.DemoError` carries the failed
worker's exception and traceback (the first failure first); a job that exceeds ``timeout`` is
stopped the same way.

With ``net`` (a :class:`hipress.bench.netsim.Network` the caller has entered, e.g. a
``ShapedNetwork`` whose NICs are rate-limited), each worker first moves into its own network
namespace, and rank 0 hosts the rendezvous store at its address there.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

from hipress.bench.netsim import STORE_PORT, deferred_signals, run_rank
from hipress.demo.config import DemoError

__all__ = ["launch"]

_GRACE_S = 3.0  # after one worker fails, how long the others get to exit on their own
_POLL_S = 0.1


@contextlib.contextmanager
def _quiet_store_lookups(on: bool) -> Iterator[None]:
    """Spawn workers with torch's C++ log level at ERROR (unless the user set one): inside a
    network namespace, rank 0's store cannot resolve its peers' names and c10d logs a warning
    per connection ("The hostname of the client socket cannot be retrieved"), which is
    harmless and only clutters the demo's output."""
    key = "TORCH_CPP_LOG_LEVEL"
    if not on or key in os.environ:
        yield
        return
    os.environ[key] = "ERROR"
    try:
        yield
    finally:
        del os.environ[key]


def _stop(procs: Sequence[Any]) -> None:
    started = [p for p in procs if p.pid is not None]
    for p in started:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 2.0
    for p in started:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def _failure_text(out: Path, procs: Sequence[Any], order: Sequence[int]) -> str:
    """The first failed rank's exception and traceback, then one line per other failed rank
    (usually the consequence: its peer's sockets closed)."""
    parts = []
    for r in order:
        err = out / f"error{r}.txt"
        if err.exists():
            text = err.read_text().rstrip()
            summary = text.splitlines()[-1] if text else "(no message)"
            parts.append(f"rank {r}: {summary}")
            if len(parts) == 1:
                parts.append(f"--- rank {r} traceback ---\n{text}\n---")
        elif procs[r].exitcode not in (0, None):
            parts.append(f"rank {r} exited with status {procs[r].exitcode}")
    return "\n".join(parts)


def launch(
    fn: Callable[..., Any],
    world_size: int,
    args: tuple[Any, ...] = (),
    *,
    timeout: float = 900.0,
    threads: int = 1,
    pg_timeout: float = 300.0,
    on_tick: Callable[[], None] | None = None,
    net: Any = None,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ranks ``0..world_size-1``, each in its own process.

    ``fn`` and ``args`` must be picklable (``fn`` at module level). ``threads`` is each worker's
    torch thread count; ``pg_timeout`` the process group's timeout; ``on_tick`` is called about
    ten times a second while the workers run; ``net`` an entered :class:`hipress.bench.netsim.Network`
    to run the workers in (None: loopback in this namespace). Returns the return values in rank order. Raises
    :class:`DemoError` if a worker raised or died (with its traceback) or the job took longer
    than ``timeout`` seconds; every worker has been stopped by then.
    """
    ctx = mp.get_context("spawn")
    if net is None:
        store = dist.TCPStore(
            "127.0.0.1", 0, world_size + 1, is_master=True, wait_for_workers=False
        )
        port = store.port
    else:
        port = STORE_PORT
    with tempfile.TemporaryDirectory(prefix="hipress-demo-") as outdir:
        out = Path(outdir)
        procs = [
            ctx.Process(
                target=run_rank,
                args=(net, fn, r, world_size, port, outdir, pg_timeout, threads, args),
                name=f"hipress-demo-rank{r}",
            )
            for r in range(world_size)
        ]
        try:
            with _quiet_store_lookups(net is not None), deferred_signals():
                for p in procs:
                    p.start()
            deadline = time.monotonic() + timeout
            failed: list[int] = []
            while True:
                codes = [p.exitcode for p in procs]
                failed += [r for r, c in enumerate(codes) if c not in (0, None) and r not in failed]
                if all(c == 0 for c in codes):
                    break
                if failed:
                    end = time.monotonic() + _GRACE_S
                    while time.monotonic() < end and any(p.is_alive() for p in procs):
                        time.sleep(_POLL_S)
                    failed += [
                        r for r, p in enumerate(procs) if p.exitcode and r not in failed
                    ]  # later failures usually only saw the first one's sockets close
                    _stop(procs)
                    raise DemoError("a worker failed:\n" + _failure_text(out, procs, failed))
                if time.monotonic() > deadline:
                    _stop(procs)
                    raise DemoError(f"the workers did not finish within {timeout:.0f} s (stopped)")
                if on_tick is not None:
                    on_tick()
                time.sleep(_POLL_S)
        except BaseException:
            _stop(procs)
            raise
        return [pickle.loads((out / f"result{r}.pkl").read_bytes()) for r in range(world_size)]
