"""Run a function on every rank of a local multi-process gloo group.

The CLI and the benchmark have no process group of their own; :func:`run_local` starts
``nproc`` fresh processes on this machine (from a forkserver that imported torch once), joins
them in a gloo group through a file rendezvous in a fresh temporary directory (no port is
guessed), runs ``fn(rank, world, *args)`` on each and returns every rank's result.
:func:`measure_local` uses it to measure the network.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from hipress.core.signals import deferred_signals, ready_forkserver

log = logging.getLogger(__name__)

PRELOAD = ("torch", "torch.distributed")


class LocalGroupError(RuntimeError):
    """A rank of the local group failed or the group did not finish in time."""


def _entry(
    rank: int,
    world: int,
    init_file: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    results: Any,
    threads: int,
    pg_timeout_s: float,
) -> None:
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(threads)
        dist.init_process_group(
            "gloo",
            init_method=f"file://{init_file}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=pg_timeout_s),
        )
        try:
            out = fn(rank, world, *args)
        finally:
            dist.destroy_process_group()
        results.put((rank, True, out))
    except BaseException:  # report any failure to the parent instead of hanging it
        results.put((rank, False, traceback.format_exc()))


def run_local(
    fn: Callable[..., Any],
    nproc: int,
    *args: Any,
    timeout_s: float = 300.0,
    threads: int | None = None,
) -> list[Any]:
    """Run ``fn(rank, world, *args)`` in ``nproc`` local processes joined in one gloo group.

    ``fn`` must be importable (a module-level function) and its arguments and result
    picklable; ``threads`` is each process's torch thread count (default 1). Returns every
    rank's result in rank order. Raises :class:`LocalGroupError` with the failing rank's
    traceback if a rank fails, or if the group does not finish within ``timeout_s``
    (stragglers are killed).
    """
    if nproc < 2:
        raise LocalGroupError(f"a local group needs at least 2 processes, got {nproc}")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))
    ready_forkserver(ctx)
    results = ctx.Queue()
    out: dict[int, Any] = {}
    with tempfile.TemporaryDirectory(prefix="hipress-secopa-") as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        pg_timeout = min(timeout_s, 600.0)
        procs = [
            ctx.Process(
                target=_entry,
                args=(r, nproc, init_file, fn, args, results, threads or 1, pg_timeout),
                name=f"secopa-rank{r}",
                daemon=True,
            )
            for r in range(nproc)
        ]
        with deferred_signals():  # a signal mid-start would leave a half-started rank
            for p in procs:
                p.start()
        deadline = time.monotonic() + timeout_s
        try:
            while len(out) < nproc:
                try:
                    rank, ok, value = results.get(timeout=max(0.1, deadline - time.monotonic()))
                except queue.Empty:
                    raise LocalGroupError(
                        f"local gloo group of {nproc}: {nproc - len(out)} rank(s) did not "
                        f"finish within {timeout_s:.0f} s"
                    ) from None
                if not ok:
                    raise LocalGroupError(f"rank {rank} of the local gloo group failed:\n{value}")
                out[rank] = value
        finally:
            # every result in: the ranks are leaving, give them time; a failed rank, the
            # timeout or an interruption (SIGTERM, Ctrl-C): the others may wait in a
            # collective for the failed one, so end them now
            grace = 5.0 if len(out) == nproc else 0.0
            for p in procs:
                p.join(timeout=grace)
                if p.is_alive():
                    p.kill()
                    p.join()
    return [out[r] for r in range(nproc)]


def _network_worker(rank: int, world: int) -> Any:
    from hipress.secopa.measure.netprofiler import measure_network, network_meta

    net = measure_network()
    return net, network_meta(net)


def measure_local(nproc: int = 2, threads: int | None = 1) -> Any:
    """Measure the network of a local ``nproc``-process gloo group.

    Returns ``(NetworkSamples, meta)``; every rank measures the same (MAX-reduced) figures.
    """
    return run_local(_network_worker, nproc, threads=threads)[0]
