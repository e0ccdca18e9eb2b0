"""Running a function on every rank of a network: :func:`run_in_network` starts one fresh
process per rank (a forkserver that imported torch once); :func:`run_rank` is each process's
body: move into the rank's namespace with ``setns`` before torch.distributed starts, join the
gloo group, run, and leave the result (or the traceback) in a file."""

from __future__ import annotations

import datetime
import multiprocessing
import os
import pickle
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hipress.bench.netsim.network import STORE_PORT, Network, ShapedNetwork, WorkerFailed
from hipress.core.signals import deferred_signals, ready_forkserver

__all__ = ["deferred_signals", "run_in_network", "run_rank", "run_to_completion", "worker_failures"]


def run_rank(
    net: Network | None,
    fn: Callable[..., Any],
    rank: int,
    world: int,
    port: int,
    outdir: str,
    pg_timeout: float,
    threads: int,
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
) -> None:
    """The body of one worker process: join a gloo group, run ``fn(rank, world, *args,
    **kwargs)``, leave ``result<rank>.pkl`` (or ``error<rank>.txt`` with the traceback) in
    ``outdir``, and end the process.

    With ``net``, the process first moves into rank's namespace and rank 0 hosts the TCP store
    at its address there; without, the store is the parent's, on 127.0.0.1:``port``.
    """
    out = Path(outdir)
    try:
        import torch
        import torch.distributed as dist

        if net is not None:
            net.enter(rank)  # before any socket exists
            os.environ["GLOO_SOCKET_IFNAME"] = net.iface
            addr, master = net.store_addr(rank), rank == 0
        else:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
            addr, master = "127.0.0.1", False
        torch.set_num_threads(threads)
        timeout = datetime.timedelta(seconds=pg_timeout)
        store = dist.TCPStore(addr, port, world, is_master=master, timeout=timeout)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
        try:
            result = fn(rank, world, *args, **(kwargs or {}))
        finally:
            dist.destroy_process_group()
        tmp = out / f"result{rank}.tmp"
        tmp.write_bytes(pickle.dumps(result))
        tmp.rename(out / f"result{rank}.pkl")
        # Leave without running C++ destructors: rank 0 may host the rendezvous store, whose
        # server thread, torn down while a peer is still connected, aborts the process
        # ("terminate called without an active exception").
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    except BaseException:
        (out / f"error{rank}.txt").write_text(traceback.format_exc())
        os._exit(1)


def run_to_completion(procs: Sequence[Any], timeout: float) -> list[Any]:
    """Start ``procs`` and wait for them together for up to ``timeout`` seconds; kill the
    ones still running then (or when the wait is interrupted). Returns those killed."""
    hung: list[Any] = []
    try:
        with deferred_signals():
            for p in procs:
                p.start()
        deadline = time.monotonic() + timeout
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
    finally:
        hung = [p for p in procs if p.is_alive()]
        for p in hung:
            p.kill()
            p.join()
    return hung


def worker_failures(
    procs: Sequence[Any], hung: Sequence[Any], out: Path, timeout: float
) -> str | None:
    """What went wrong in a group of worker processes (rank r = ``procs[r]``) that each leave
    ``error<r>.txt`` in ``out`` when they raise, ``hung`` those killed after ``timeout``
    seconds: every traceback, crash and straggler in one message; None if all ended well."""
    errors = [
        f"--- rank {r} ---\n{(out / f'error{r}.txt').read_text()}"
        for r in range(len(procs))
        if (out / f"error{r}.txt").exists()
    ]
    crashed = [
        f"rank {r} exited with status {p.exitcode}"
        for r, p in enumerate(procs)
        if p not in hung and p.exitcode != 0 and not (out / f"error{r}.txt").exists()
    ]
    if not (hung or errors or crashed):
        return None
    head = f"{len(hung)} worker(s) still running after {timeout:.0f}s; " if hung else ""
    return head + "\n".join(crashed + errors)


def _free_loopback_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_in_network(
    net: Network,
    fn: Callable[..., Any],
    *args: Any,
    timeout: float = 600.0,
    pg_timeout: float = 120.0,
    threads: int = 1,
    preload: Sequence[str] = ("torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo"),
    **kwargs: Any,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args, **kwargs)`` on every rank of ``net`` (an entered
    network), each in a fresh process inside its own namespace with a gloo default group.

    ``fn`` and its arguments must be picklable (module level). ``threads`` is each worker's torch
    thread count. Returns the results in rank order. Raises :class:`WorkerFailed` with every
    traceback if a worker raised or crashed, or if the group is still running after ``timeout``
    seconds (the stragglers are killed).
    """
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(preload))
    port = STORE_PORT if isinstance(net, ShapedNetwork) else _free_loopback_port()
    ready_forkserver(ctx)
    with tempfile.TemporaryDirectory(prefix="hipress-netsim-") as outdir:
        procs = [
            ctx.Process(
                target=run_rank,
                args=(net, fn, r, net.world_size, port, outdir, pg_timeout, threads, args, kwargs),
                name=f"rank{r}",
            )
            for r in range(net.world_size)
        ]
        hung = run_to_completion(procs, timeout)
        out = Path(outdir)
        failure = worker_failures(procs, hung, out, timeout)
        if failure is not None:
            raise WorkerFailed(failure)
        return [pickle.loads((out / f"result{r}.pkl").read_bytes()) for r in range(net.world_size)]
