"""Simulated cluster networks: one network namespace per worker, joined by veth links to a
bridge, each link rate-shaped with ``tc ... tbf`` (:class:`ShapedNetwork`), or plain loopback
with a label saying why (:class:`LoopbackNetwork`); :func:`open_network` picks one. See
:mod:`hipress.bench.netsim`.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import secrets
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

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
    "list_namespaces",
    "open_network",
    "shaping_unavailable_reason",
    "tx_bytes",
]

logger = logging.getLogger(__name__)

PREFIX = "hpns"
NETNS_DIR = Path("/var/run/netns")
_CLONE_NEWNET = 0x40000000
_NAME_RE = re.compile(rf"^{PREFIX}-(\d+)-([0-9a-f]+)-")
STORE_PORT = 29500  # the namespace is fresh, so this port is always free there


class NetSimError(RuntimeError):
    """Setting up or tearing down the simulated network failed (the message has the command)."""


class NetSimUnavailable(NetSimError):
    """Shaped networking needs root and iproute2 (``ip``, ``tc``); the message says which is
    missing and what to do."""


class WorkerFailed(RuntimeError):
    """A worker raised, crashed or the group timed out; the message holds every traceback."""


def shaping_unavailable_reason() -> str | None:
    """Why :class:`ShapedNetwork` cannot run here, or None when it can (root, ``ip``, ``tc``)."""
    if os.geteuid() != 0:
        return "not root: network namespaces and tc shaping need root (run as root or with sudo)"
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
    if missing:
        return f"{' and '.join(missing)} not found: install iproute2 (apt-get install -y iproute2)"
    return None


def _run(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise NetSimError(f"`{' '.join(argv)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def list_namespaces(prefix: str = PREFIX) -> list[str]:
    """Names of the existing network namespaces that start with ``prefix``."""
    if not NETNS_DIR.is_dir():
        return []
    return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(prefix + "-"))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_stale() -> list[str]:
    """Delete the namespaces of earlier runs whose owning process no longer exists (a crash or a
    kill -9). Namespaces of live runs (other tests, other benchmarks) are left alone. Returns the
    deleted names."""
    deleted = []
    for name in list_namespaces():
        m = _NAME_RE.match(name)
        if m is None or _pid_alive(int(m.group(1))):
            continue
        if _run(["ip", "netns", "delete", name], check=False).returncode == 0:
            deleted.append(name)
    if deleted:
        logger.warning("netsim: deleted %d stale namespace(s): %s", len(deleted), deleted)
    return deleted


class Network:
    """Where the workers of :func:`run_in_network` live. Fields:

    world_size: number of workers.
    label: a human-readable description for tables ("4 x 1000 Mbit/s shaped", "loopback ...").
    shaped: True when each worker has a rate-limited NIC of its own.
    rate_mbit: the per-worker NIC rate in Mbit/s (None: unshaped).
    iface: the interface gloo binds to (``GLOO_SOCKET_IFNAME``).
    """

    world_size: int
    label: str
    shaped: bool
    rate_mbit: float | None
    iface: str

    def enter(self, rank: int) -> None:
        """Move the calling process into rank ``rank``'s network (before any socket is made)."""

    def store_addr(self, rank: int) -> str:
        """Address of rank 0's rendezvous store as seen from ``rank``."""
        raise NotImplementedError

    def as_dict(self) -> dict[str, Any]:
        """A JSON-able description for result files."""
        return {
            "label": self.label,
            "shaped": self.shaped,
            "rate_mbit": self.rate_mbit,
            "world_size": self.world_size,
        }

    def __enter__(self) -> Network:
        return self

    def __exit__(
        self,
        et: type[BaseException] | None,
        ev: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None


class LoopbackNetwork(Network):
    """The fallback: every worker in the calling namespace, talking over loopback, unshaped (so
    communication is nearly free and figures are NOT comparable with a real cluster)."""

    def __init__(self, world_size: int, reason: str = "") -> None:
        self.world_size = world_size
        self.shaped = False
        self.rate_mbit = None
        self.iface = "lo"
        self.reason = reason
        self.label = "loopback, UNSHAPED" + (f" ({reason})" if reason else "")

    def store_addr(self, rank: int) -> str:
        return "127.0.0.1"

    def as_dict(self) -> dict[str, Any]:
        return {**super().as_dict(), "reason": self.reason}


class ShapedNetwork(Network):
    """N namespaces ``hpns-<pid>-<tag>-w<i>``, each with ``eth0`` at ``<subnet>.<i+1>/24``, joined
    by veth pairs to the bridge ``br0`` in ``hpns-<pid>-<tag>-br``; with ``rate_mbit`` set, a tbf
    qdisc limits each worker's egress and the bridge port's egress towards it, so each worker has
    a full-duplex NIC of that rate.

    Args:
        world_size: number of worker namespaces (1..250).
        rate_mbit: NIC rate in Mbit/s, or None for unshaped veth links.
        subnet: first three octets of the private /24 used inside the namespaces only.
        queue_ms: tbf queue length in milliseconds of traffic at the link rate.

    Creation happens in ``__enter__`` (stale namespaces of dead runs are cleaned up first);
    ``__exit__`` deletes every namespace of this run whatever happened. Raises
    :class:`NetSimUnavailable` when not root or iproute2 is missing, :class:`NetSimError` when a
    command fails (after tearing down what was made).
    """

    def __init__(
        self,
        world_size: int,
        rate_mbit: float | None = 1000.0,
        *,
        subnet: str = "10.213.0",
        queue_ms: float = 20.0,
    ) -> None:
        if not 1 <= world_size <= 250:
            raise ValueError(f"world_size must be in 1..250, got {world_size}")
        if rate_mbit is not None and rate_mbit <= 0:
            raise ValueError(f"rate_mbit must be positive, got {rate_mbit}")
        if not re.fullmatch(r"10\.\d{1,3}\.\d{1,3}", subnet):
            raise ValueError(f"subnet must be three octets of 10.0.0.0/8 like '10.213.0': {subnet}")
        self.world_size = world_size
        self.rate_mbit = rate_mbit
        self.shaped = rate_mbit is not None
        self.subnet = subnet
        self.queue_ms = queue_ms
        self.iface = "eth0"
        self.tag = f"{PREFIX}-{os.getpid()}-{secrets.token_hex(3)}"
        self.namespaces = tuple(f"{self.tag}-w{i}" for i in range(world_size))
        self.bridge_ns = f"{self.tag}-br"
        self.addresses = tuple(f"{subnet}.{i + 1}" for i in range(world_size))
        rate = f"{rate_mbit:g} Mbit/s shaped" if rate_mbit else "unshaped veth"
        self.label = f"{world_size} namespaces x {rate} NIC"
        self._created: list[str] = []

    # ---- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> ShapedNetwork:
        reason = shaping_unavailable_reason()
        if reason is not None:
            raise NetSimUnavailable(reason)
        cleanup_stale()
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        logger.info("netsim: up: %s (%s)", self.label, self.tag)
        return self

    def __exit__(
        self,
        et: type[BaseException] | None,
        ev: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Delete every namespace of this run (idempotent; also those a failed build left)."""
        for name in [*self._created, *list_namespaces(self.tag)]:
            if (NETNS_DIR / name).exists():
                proc = _run(["ip", "netns", "delete", name], check=False)
                if proc.returncode != 0:
                    logger.error("netsim: could not delete %s: %s", name, proc.stderr.strip())
        self._created.clear()

    def _netns_add(self, name: str) -> None:
        self._created.append(name)
        _run(["ip", "netns", "add", name])
        _run(["ip", "-n", name, "link", "set", "lo", "up"])

    def _shape(self, ns: str, dev: str) -> None:
        assert self.rate_mbit is not None
        rate_bytes = self.rate_mbit * 1e6 / 8
        # burst: 1 ms at line rate (at least 64 KiB so GSO segments pass); queue: queue_ms
        burst = max(64 * 1024, int(rate_bytes * 1e-3))
        limit = burst + int(rate_bytes * self.queue_ms * 1e-3)
        _run(
            [
                "tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf",
                "rate", f"{self.rate_mbit:g}mbit", "burst", str(burst), "limit", str(limit),
            ]
        )  # fmt: skip

    def _build(self) -> None:
        br = self.bridge_ns
        self._netns_add(br)
        _run(["ip", "-n", br, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", br, "link", "set", "br0", "up"])
        for i, (ns, addr) in enumerate(zip(self.namespaces, self.addresses, strict=True)):
            self._netns_add(ns)
            port = f"w{i}"
            _run(
                [
                    "ip", "link", "add", "eth0", "netns", ns, "type", "veth",
                    "peer", "name", port, "netns", br,
                ]
            )  # fmt: skip
            _run(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            _run(["ip", "-n", br, "link", "set", port, "master", "br0"])
            _run(["ip", "-n", br, "link", "set", port, "up"])
            if self.rate_mbit is not None:
                self._shape(ns, "eth0")
                self._shape(br, port)

    # ---- use ---------------------------------------------------------------------------------

    def enter(self, rank: int) -> None:
        fd = os.open(NETNS_DIR / self.namespaces[rank], os.O_RDONLY)
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.setns(fd, _CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise NetSimError(f"setns into {self.namespaces[rank]}: {os.strerror(err)}")
        finally:
            os.close(fd)

    def store_addr(self, rank: int) -> str:
        return self.addresses[0]

    def qdisc_stats(self) -> list[str]:
        """``tc -s qdisc`` of every worker's eth0 (for diagnostics: drops, overlimits)."""
        return [
            _run(["tc", "-n", ns, "-s", "qdisc", "show", "dev", "eth0"]).stdout
            for ns in self.namespaces
        ]

    def as_dict(self) -> dict[str, Any]:
        return {**super().as_dict(), "subnet": f"{self.subnet}.0/24", "queue_ms": self.queue_ms}


def open_network(world_size: int, rate_mbit: float | None, *, shaped: bool = True) -> Network:
    """A :class:`ShapedNetwork` when possible (and ``shaped``), else a :class:`LoopbackNetwork`
    whose label says why. Use it as a context manager either way."""
    reason = shaping_unavailable_reason() if shaped else "shaping not requested"
    if reason is None:
        return ShapedNetwork(world_size, rate_mbit)
    logger.warning("netsim: falling back to UNSHAPED loopback: %s", reason)
    return LoopbackNetwork(world_size, reason)


def tx_bytes(iface: str) -> int | None:
    """Bytes transmitted so far on ``iface`` of the calling process's network namespace (a
    worker's NIC counter: TCP/IP headers and every collective included); None if there is no
    such interface."""
    with open("/proc/self/net/dev") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip() == iface:
                return int(rest.split()[8])
    return None
