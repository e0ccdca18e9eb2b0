"""Train a small MLP with FSDP2 (``fully_shard``), its reduce-scatters compressed by hipress.

Launch (2 CPU processes on this machine, gloo)::

    torchrun --standalone --nproc-per-node 2 examples/fsdp2_train.py --steps 50

Options: ``--algorithm`` (default: qsgd), ``--steps``. Rank 0 prints the plan, the loss and
hipress's metrics (``comp.metrics()``).
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

import hipress.fsdp
from hipress.codec.planning import DEFAULT_ALGORITHM


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--algorithm", default=DEFAULT_ALGORITHM)
    ap.add_argument("--steps", type=int, default=100)
    args = ap.parse_args()
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank = dist.get_rank()
    if torch.cuda.is_available():
        torch.cuda.set_device(rank % torch.cuda.device_count())
    device = torch.device("cuda") if torch.cuda.is_available() else None

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 1),
    ).to(device)  # fmt: skip
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    # every unit of at least 1024 elements compresses (the default: 65536)
    comp = hipress.fsdp.register(model, args.algorithm, min_compress_numel=1024)
    if rank == 0:
        print(comp.plan)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    w = torch.linspace(-1, 1, 16, device=device)
    gen = torch.Generator(device=device or "cpu").manual_seed(rank)
    for step in range(args.steps):
        x = torch.randn(64, 16, generator=gen, device=device)
        loss = torch.nn.functional.mse_loss(model(x), torch.sin(x @ w).unsqueeze(1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and (step % 20 == 0 or step == args.steps - 1):
            ratio = comp.metrics()["hipress/bytes_ratio"]
            print(f"step {step:4d}  loss {loss.item():.5f}  bytes sent {ratio:.1%} of FSDP2's")
    dist.barrier()  # (every rank done with its last collective before the group goes)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
