"""After a peer dies, the survivors raise CommError, and a script that catches it and exits
keeps its own exit status: nothing CaSync issued is still pending when the interpreter shuts
down (gloo aborts a process whose group still has work pending then: SIGABRT, status 134)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent("""
    import datetime, os, sys, torch, torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from hipress.casync import CommError, register
    from hipress.core.plan import Plan, Strategy, TensorPlan

    rank, world, strategy, port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    # connecting waits as long as the ranks take to start; the group that trains gives up on
    # a silent peer after 5 s
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    group = dist.new_group(timeout=datetime.timedelta(seconds=5))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 10))
    ddp = DDP(model, process_group=group)
    s = Strategy(strategy)
    plan = Plan("terngrad", {}, world, tuple(
        TensorPlan(n, p.numel(), p.numel() >= 4 * world, s if p.numel() >= 4 * world
                   else Strategy.ALLREDUCE, 1) for n, p in model.named_parameters()))
    register(ddp, "terngrad", plan=plan, log_every=0)
    x = torch.randn(32, 64)
    for step in range(100):
        if step == 3 and rank == world - 1:
            os._exit(0)  # gone without a word
        try:
            ddp(x).square().mean().backward()
        except CommError:
            sys.exit(3)
""")


def _ports(n: int) -> list[str]:
    """``n`` distinct free ports (all bound at once, so no two are the same)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [str(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def _launch(script: Path, world: int, port: str, *args: str) -> list[subprocess.Popen[bytes]]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return [subprocess.Popen([sys.executable, str(script), str(r), *args, port], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            for r in range(world)]  # fmt: skip


@pytest.mark.parametrize("strategy", ["allgather", "ring", "ps"])
def test_survivors_keep_their_exit_status(strategy: str, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    # two launches side by side, each its own group: a launch spends seconds idle (the peer
    # timeout, the exit)
    launches = [_launch(script, 4, port, "4", strategy) for port in _ports(2)]
    for procs in launches:
        codes = [p.wait(timeout=240) for p in procs]
        outs = [p.stdout.read().decode(errors="replace")[-2000:] for p in procs]  # type: ignore[union-attr]
        assert codes == [3, 3, 3, 0], (codes, outs)


CLEAN = textwrap.dedent("""
    import sys, torch, torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from hipress.casync import register

    rank, port = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8))
    ddp = DDP(model)
    register(ddp, "onebit", log_every=0)
    for _ in range(5):
        ddp(torch.randn(16, 64)).sum().backward()
    dist.all_reduce(torch.ones(1000))
    dist.barrier()  # and the script ends, without destroy_process_group
""")


def test_a_script_that_ends_without_destroying_its_group_exits_cleanly(tmp_path: Path) -> None:
    """Left to interpreter shutdown, a gloo worker thread may release its last finished
    collective after Python stopped handing out the GIL (std::terminate: SIGABRT), in about one
    launch in four on this torch; a process where CaSync ran waits a moment at exit for the
    backend threads, so every launch exits 0."""
    script = tmp_path / "clean.py"
    script.write_text(CLEAN)
    codes = []
    launches = [_launch(script, 2, port) for port in _ports(6)]  # side by side
    for procs in launches:
        codes += [p.wait(timeout=240) for p in procs]
        for p in procs:
            p.stdout.close()  # type: ignore[union-attr]
    assert codes == [0] * 12, codes
