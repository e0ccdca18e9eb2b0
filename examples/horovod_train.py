"""Train a small MLP with Horovod, gradients compressed by hipress (onebit, with error feedback).

Launch (2 processes on this machine, CPU, Gloo)::

    horovodrun -np 2 -H localhost:2 --gloo python examples/horovod_train.py

Options: ``--algorithm none`` (no compression: exactly ``hvd.DistributedOptimizer``),
``--algorithm terngrad --bitwidth 4`` (any CompLL algorithm; ``--bitwidth`` is TernGrad's),
``--steps 300``, ``--backward-passes 2``,
``--plan plan.json`` (a SeCoPa plan). Rank 0 prints the loss; each rank saves its compression
state (error feedback) to ``--checkpoint-dir`` at the end.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import horovod.torch as hvd
import torch

import hipress.horovod
from hipress.casync import DefaultRule
from hipress.codec.planning import DEFAULT_ALGORITHM


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--algorithm", default=DEFAULT_ALGORITHM)
    ap.add_argument("--bitwidth", type=int, default=2)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--backward-passes", type=int, default=1)
    ap.add_argument("--plan", default=None)
    ap.add_argument("--checkpoint-dir", type=Path, default=None)
    args = ap.parse_args()

    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 1),
    )  # fmt: skip
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    algorithm = None if args.algorithm == "none" else args.algorithm
    params = {"bitwidth": args.bitwidth} if args.algorithm == "terngrad" else {}
    opt = hipress.horovod.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9),
        named_parameters=model.named_parameters(),
        algorithm=algorithm,
        params=params,
        plan=args.plan,
        backward_passes_per_step=args.backward_passes,
        rule=DefaultRule(min_compress_numel=1 << 12),  # compress this small model's weights
    )
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    if hvd.rank() == 0:
        sync = opt.hipress_sync
        for e in sync.plan.entries:
            how = f"{e.strategy.value} x{e.partitions}" if e.compress else "allreduce"
            print(f"  {e.name:10s} {e.numel:8d} elements: {how}")

    w = torch.linspace(-1, 1, 16)
    gen = torch.Generator().manual_seed(hvd.rank())
    for step in range(args.steps):
        opt.zero_grad()
        for _ in range(args.backward_passes):
            x = torch.randn(64, 16, generator=gen)
            y = torch.sin(x @ w).unsqueeze(1)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
        opt.step()
        if step % 50 == 0 or step == args.steps - 1:
            avg = hvd.allreduce(loss.detach(), name="loss").item()
            if hvd.rank() == 0:
                print(f"step {step:4d}  loss {avg:.5f}")

    if args.checkpoint_dir is not None:
        args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        path = args.checkpoint_dir / f"hipress-rank{hvd.rank()}.pt"
        torch.save(opt.compression_state_dict(), path)


if __name__ == "__main__":
    main()
