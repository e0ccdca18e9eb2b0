"""Multi-process gloo helpers for tests: run a function on N ranks, each a fresh process.

    from dist_utils import run_workers

    def work(rank: int, world_size: int, n: int) -> torch.Tensor:   # module level, importable
        x = torch.full((n,), float(rank))
        dist.all_reduce(x)
        return x

    def test_sum():
        for x in run_workers(work, 4, 10):          # one result per rank
            assert x.eq(6).all()

Processes come from a ``forkserver`` that has imported torch once, so starting a group costs
~0.1 s instead of ~3 s per process with ``spawn``; each worker is still a fresh process (no state
is inherited from the test process). Rendezvous goes through a TCPStore the parent hosts on a port
the OS picks (no port races). A worker that raises fails the call with its traceback; a group that
does not finish within ``timeout`` is killed and fails the call; a worker that exits on purpose
(``os._exit(0)``) yields ``None``.

(:func:`hipress.bench.netsim.run_in_network` does the same inside simulated networks, for benchmarks.)
"""

from __future__ import annotations

import datetime
import faulthandler
import multiprocessing
import os
import pickle
import tempfile
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hipress.bench.netsim.run import run_to_completion, worker_failures

__all__ = ["DEFAULT_PRELOAD", "WorkerError", "run_workers"]

# imported once by the forkserver, so each worker starts with them loaded (missing ones are
# skipped); DDP's constructor imports torch._dynamo, which alone takes seconds
DEFAULT_PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.nn.parallel",
    "torch._dynamo",
    "hipress.casync",
    "hipress.compll",
)


class WorkerError(RuntimeError):
    """A worker raised, crashed or the group timed out; the message holds every traceback."""


def _worker_main(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    port: int,
    outdir: str,
    pg_timeout: float,
    threads: int,
    backend: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> None:
    out = Path(outdir)
    faulthandler.enable(all_threads=True)  # a crashing worker prints every thread's stack
    try:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        torch.set_num_threads(threads)
        if backend == "nccl":  # one GPU per rank
            torch.cuda.set_device(rank % torch.cuda.device_count())
        store = dist.TCPStore(
            "127.0.0.1",
            port,
            world_size,
            is_master=False,
            timeout=datetime.timedelta(seconds=pg_timeout),
        )
        dist.init_process_group(
            backend,
            store=store,
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=pg_timeout),
        )
        try:
            result = fn(rank, world_size, *args, **kwargs)
        finally:
            dist.destroy_process_group()
        tmp = out / f"result{rank}.tmp"
        with tmp.open("wb") as f:
            pickle.dump(result, f)
        tmp.rename(out / f"result{rank}.pkl")
    except BaseException:
        (out / f"error{rank}.txt").write_text(traceback.format_exc())
        os._exit(1)


def run_workers(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 120.0,
    pg_timeout: float = 30.0,
    threads: int = 1,
    preload: Sequence[str] = DEFAULT_PRELOAD,
    backend: str = "gloo",
    **kwargs: Any,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args, **kwargs)`` on ranks ``0..world_size-1``, each in its
    own process with the default process group (gloo, loopback) initialised.

    ``fn`` and its arguments must be picklable (a module-level function). ``pg_timeout`` is the
    process group's timeout; ``threads`` is each worker's torch thread count; ``preload`` are the
    modules the forkserver imports when it starts (the first call in a process decides). Returns the
    workers' return values in rank order (``None`` for a worker that exited with status 0 without
    returning). Raises :class:`WorkerError` if any worker failed or the group exceeded
    ``timeout`` seconds (stragglers are killed). ``backend``: the process group's ("nccl":
    rank r uses GPU r).
    """
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(preload))
    store = dist.TCPStore("127.0.0.1", 0, world_size + 1, is_master=True, wait_for_workers=False)
    with tempfile.TemporaryDirectory(prefix="hipress-dist-") as outdir:
        procs = [
            ctx.Process(
                target=_worker_main,
                args=(
                    fn,
                    r,
                    world_size,
                    store.port,
                    outdir,
                    pg_timeout,
                    threads,
                    backend,
                    args,
                    kwargs,
                ),
                name=f"rank{r}",
            )
            for r in range(world_size)
        ]
        hung = run_to_completion(procs, timeout)
        out = Path(outdir)
        failure = worker_failures(procs, hung, out, timeout)
        if failure is not None:
            raise WorkerError(failure)
        results = []
        for r in range(world_size):
            path = out / f"result{r}.pkl"
            results.append(pickle.loads(path.read_bytes()) if path.exists() else None)
        return results
