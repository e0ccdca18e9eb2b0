"""A simulated cluster network on one machine: one network namespace per worker, joined by veth
links to a bridge, each link rate-shaped with ``tc ... tbf`` so every worker has a NIC of a given
bandwidth (full duplex: shaped on the worker's egress and on the bridge port's egress).

    with ShapedNetwork(4, rate_mbit=1000) as net:     # needs root and iproute2
        results = run_in_network(net, work, 64)       # work(rank, world_size, 64) on 4 ranks

    net = open_network(4, rate_mbit=1000)              # ShapedNetwork, or LoopbackNetwork with a
                                                       # label saying why, when not root / no `ip`

Addresses come from a private range (``10.213.0.0/24`` by default) that exists ONLY inside the
namespaces created here: traffic never leaves them. Every namespace of one run is named
``hpns-<pid>-<random>-...``; the context manager deletes them all on exit, exceptions and
KeyboardInterrupt included, and :func:`cleanup_stale` deletes those left by a run whose process
is gone (called on every start). Deleting a namespace also deletes its veth ends and qdiscs.

``run_in_network`` runs a function in N fresh processes (a forkserver that imported torch once),
each moved into its worker's namespace with ``setns`` before torch.distributed starts; the gloo
group rendezvouses at rank 0's address. netem (delay, loss) is not available in this kernel, so
links have rate limits but no added latency.
"""

from __future__ import annotations

from hipress.bench.netsim.network import (
    NETNS_DIR,
    PREFIX,
    STORE_PORT,
    LoopbackNetwork,
    NetSimError,
    NetSimUnavailable,
    Network,
    ShapedNetwork,
    WorkerFailed,
    cleanup_stale,
    list_namespaces,
    open_network,
    shaping_unavailable_reason,
    tx_bytes,
)
from hipress.bench.netsim.run import deferred_signals, run_in_network, run_rank

__all__ = [
    "NETNS_DIR",
    "PREFIX",
    "STORE_PORT",
    "LoopbackNetwork",
    "NetSimError",
    "NetSimUnavailable",
    "Network",
    "ShapedNetwork",
    "WorkerFailed",
    "cleanup_stale",
    "deferred_signals",
    "list_namespaces",
    "open_network",
    "run_in_network",
    "run_rank",
    "shaping_unavailable_reason",
    "tx_bytes",
]
