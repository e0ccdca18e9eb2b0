"""torchft's ``DiLoCo`` as a row of :mod:`hipress.bench.diloco`: every worker a replica of one
process, a torchft ``Manager`` per replica (its own TCPStore), the lighthouse in rank 0's
process, gloo between replicas. On CPU torchft's DiLoCo sends its outer gradients
uncompressed (its quantisation needs Triton and CUDA).

torchft is optional: :func:`version` says whether it imports.
"""

from __future__ import annotations

import importlib.metadata
import socket
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

__all__ = ["build", "version"]

LIGHTHOUSE_PORT = 29610
STORE_PORT = 29611
MANAGER_PORT = 29612


def version() -> str | None:
    """torchft's version, or None where it does not import."""
    try:
        import torchft  # noqa: F401
    except ImportError:
        return None
    return importlib.metadata.version("torchft")


def build(model: torch.nn.Module, inner: torch.optim.Optimizer, h: int, rank: int, world: int,
          addresses: list[str]) -> tuple[Any, Callable[[], None]]:  # fmt: skip
    """torchft's DiLoCo over ``model`` (a context manager, as hipress's) and a function that
    shuts its manager and lighthouse down. ``addresses[r]``: rank r's address (where its
    store and manager listen). Collective: every rank calls it."""
    import torch.distributed as dist
    from torchft import Manager, ProcessGroupGloo
    from torchft.coordination import LighthouseServer
    from torchft.local_sgd import DiLoCo

    me = addresses[rank]
    lighthouse = None
    if rank == 0:
        lighthouse = LighthouseServer(bind=f"[::]:{LIGHTHOUSE_PORT}", min_replicas=world)
    # ports per rank: on loopback every rank shares one address
    store_port, manager_port = STORE_PORT + 2 * rank, MANAGER_PORT + 2 * rank
    keep = [dist.TCPStore(me, store_port, is_master=True, wait_for_workers=False)]
    dist.barrier()  # the lighthouse is up before any manager asks it
    outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=120)), min_replica_size=world,
        load_state_dict=lambda sd: model.load_state_dict(sd["model"]),
        state_dict=lambda: {"model": model.state_dict()},
        replica_id=f"replica{rank}", store_addr=me, store_port=store_port, rank=0,
        world_size=1, lighthouse_addr=f"http://{addresses[0]}:{LIGHTHOUSE_PORT}",
        port=manager_port, hostname=me if me != "127.0.0.1" else socket.gethostname(),
        timeout=timedelta(seconds=120), use_async_quorum=False,
        # every replica builds the same seeded weights: no checkpoint to fetch at start (its
        # HTTP transport advertises the host name, which the namespaces cannot resolve)
        init_sync=False,
    )  # fmt: skip
    diloco = DiLoCo(manager, [model], inner, outer, sync_every=h)

    def close() -> None:
        manager.shutdown(wait=False)
        if lighthouse is not None:
            lighthouse.shutdown()
        keep.clear()

    return diloco, close
