"""Train a small MLP with PyTorch DDP, gradients compressed by hipress's DDP hook.

Launch (2 CPU processes on this machine, gloo)::

    torchrun --standalone --nproc-per-node 2 examples/torchrun_ddp.py --steps 50

On GPUs the same script picks NCCL. Options: ``--algorithm`` (default: qsgd; ``none`` for
plain DDP), ``--steps``. Rank 0 prints the loss and hipress's metrics.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import hipress.casync
from hipress.codec.planning import DEFAULT_ALGORITHM


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--algorithm", default=DEFAULT_ALGORITHM)
    ap.add_argument("--steps", type=int, default=100)
    args = ap.parse_args()
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank = dist.get_rank()
    gpus = torch.cuda.device_count()
    device = torch.device("cuda", rank % gpus) if gpus else None

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    ddp = DistributedDataParallel(model.to(device), device_ids=[device] if device else None)
    algorithm = None if args.algorithm == "none" else args.algorithm
    # this model's weights are small: compress every tensor of at least 1024 elements
    state = hipress.casync.register(
        ddp, algorithm, rule=hipress.casync.DefaultRule(min_compress_numel=1024)
    )
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)

    w = torch.linspace(-1, 1, 16, device=device)
    gen = torch.Generator(device=device or "cpu").manual_seed(rank)
    for step in range(args.steps):
        x = torch.randn(64, 16, generator=gen, device=device)
        loss = torch.nn.functional.mse_loss(ddp(x), torch.sin(x @ w).unsqueeze(1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and (step % 20 == 0 or step == args.steps - 1):
            m = state.metrics()
            print(f"step {step:4d}  loss {loss.item():.5f}  bytes sent "
                  f"{m['hipress/bytes_ratio']:.1%} of DDP's, encode {m['hipress/encode_ms']:.2f} ms")  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
