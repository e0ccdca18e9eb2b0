"""The shaped-network harness: real namespaces, veth links, tbf shaping and gloo across them.

Needs root and iproute2 (skipped with the reason otherwise). About 10 s in all.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest
import torch
import torch.distributed as dist

from hipress.bench.netsim import (
    NETNS_DIR,
    PREFIX,
    LoopbackNetwork,
    ShapedNetwork,
    WorkerFailed,
    cleanup_stale,
    list_namespaces,
    open_network,
    run_in_network,
    shaping_unavailable_reason,
)

_REASON = shaping_unavailable_reason()
needs_netns = pytest.mark.skipif(_REASON is not None, reason=f"shaped network: {_REASON}")

RATE_MBIT = 100.0


def _allreduce_rate(rank: int, world_size: int, nbytes: int, iters: int) -> tuple[float, float]:
    """Allreduce bandwidth (payload bytes / s) and the summed result's first element."""
    x = torch.ones(nbytes // 4)
    dist.all_reduce(x)  # connect and warm up
    dist.barrier()
    t = time.perf_counter()
    for _ in range(iters):
        x.fill_(float(rank + 1))
        dist.all_reduce(x)
    dt = time.perf_counter() - t
    return nbytes * iters / dt, float(x[0])


def _whoami(rank: int, world_size: int) -> str:
    return subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", "eth0"], capture_output=True,
                          text=True, check=True).stdout  # fmt: skip


def _boom(rank: int, world_size: int) -> None:
    if rank == 1:
        raise ValueError("rank one fails on purpose")
    dist.barrier()


@needs_netns
def test_shaped_allreduce_runs_at_the_link_rate_and_is_torn_down() -> None:
    with ShapedNetwork(2, rate_mbit=RATE_MBIT) as net:
        tag = net.tag
        assert list_namespaces(tag) == sorted([*net.namespaces, net.bridge_ns])
        out = run_in_network(net, _allreduce_rate, 1 << 20, 4, timeout=120)
        addrs = run_in_network(net, _whoami)
        stats = net.qdisc_stats()
    assert list_namespaces(tag) == []
    # each rank sees its own address on its own eth0
    for rank, text in enumerate(addrs):
        assert f"inet 10.213.0.{rank + 1}/24" in text
    for rate, first in out:
        assert first == 3.0  # 1 + 2: the collective really ran across the link
        link = RATE_MBIT * 1e6 / 8
        # a 2-rank allreduce sends the payload once each way per NIC: close to (below) line rate
        assert 0.75 * link < rate < 1.05 * link, f"{rate / 1e6:.2f} MB/s vs {link / 1e6} MB/s"
    assert all("tbf" in s and "rate 100Mbit" in s for s in stats)


@needs_netns
def test_unshaped_links_are_much_faster_than_shaped_ones() -> None:
    with ShapedNetwork(2, rate_mbit=None) as net:
        out = run_in_network(net, _allreduce_rate, 1 << 20, 4, timeout=120)
    assert all(rate > 5 * RATE_MBIT * 1e6 / 8 for rate, _ in out)


@needs_netns
def test_namespaces_are_deleted_on_exceptions_and_worker_failures() -> None:
    tag = ""
    with pytest.raises(KeyboardInterrupt), ShapedNetwork(2, rate_mbit=RATE_MBIT) as net:
        tag = net.tag
        assert len(list_namespaces(tag)) == 3
        raise KeyboardInterrupt
    assert tag and list_namespaces(tag) == []

    with (
        pytest.raises(WorkerFailed, match=r"(?s)rank 1.*rank one fails on purpose"),
        ShapedNetwork(2, rate_mbit=RATE_MBIT) as net,
    ):
        tag = net.tag
        run_in_network(net, _boom, timeout=60, pg_timeout=10)
    assert list_namespaces(tag) == []


@needs_netns
def test_stale_namespaces_of_dead_runs_are_cleaned_but_live_ones_kept() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that no longer exists
    stale = f"{PREFIX}-{dead.pid}-abcdef-w0"
    live = f"{PREFIX}-{os.getpid()}-abcdef-w0"
    for name in (stale, live):
        subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        deleted = cleanup_stale()
        assert stale in deleted
        assert not (NETNS_DIR / stale).exists()
        assert (NETNS_DIR / live).exists()
    finally:
        for name in (stale, live):
            subprocess.run(["ip", "netns", "delete", name], check=False)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="world_size"):
        ShapedNetwork(0)
    with pytest.raises(ValueError, match="rate_mbit"):
        ShapedNetwork(2, rate_mbit=-1)
    with pytest.raises(ValueError, match="subnet"):
        ShapedNetwork(2, subnet="192.168.1")


def test_loopback_fallback_is_labelled_and_works() -> None:
    net = open_network(2, 1000.0, shaped=False)
    assert isinstance(net, LoopbackNetwork)
    assert "UNSHAPED" in net.label and not net.shaped
    with net:
        out = run_in_network(net, _allreduce_rate, 1 << 16, 2, timeout=120)
    assert [first for _, first in out] == [3.0, 3.0]
