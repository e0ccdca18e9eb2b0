"""Local-step training with hipress.diloco: each worker takes H inner AdamW steps alone, then
the workers average the change of their weights, compressed with blocksign (signs and a scale
per 128 elements, error feedback on), and an outer optimizer applies it. Saves and resumes a checkpoint per rank.

    torchrun --nproc-per-node 4 examples/diloco_train.py --algorithm blocksign --sync-every 16
    torchrun --nproc-per-node 4 examples/diloco_train.py --resume   # continues from ckpt/

Runs on CPUs (gloo) or, with --device cuda and one GPU per rank, on GPUs (nccl).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from hipress.diloco import DiLoCo


def batches(rank: int, steps: range, device: torch.device):  # type: ignore[no-untyped-def]
    """A regression task: a fixed random two-layer map, different samples per rank and step."""
    w = torch.randn(32, 8, generator=torch.Generator().manual_seed(0))
    for step in steps:
        g = torch.Generator().manual_seed(100_000 * rank + step)
        x = torch.randn(64, 32, generator=g)
        yield step, x.to(device), torch.tanh(x @ w).to(device)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--algorithm", default="blocksign", help="a CompLL algorithm, or none")
    p.add_argument("--sync-every", type=int, default=16)
    p.add_argument("--steps", type=int, default=320)
    p.add_argument("--device", default="cpu")
    p.add_argument("--checkpoint", type=Path, default=Path("ckpt"))
    p.add_argument("--resume", action="store_true")
    a = p.parse_args()
    device = torch.device(a.device)
    if device.type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        device = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank = dist.get_rank()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 256), nn.Tanh(), nn.Linear(256, 8)).to(device)
    inner = torch.optim.AdamW(model.parameters(), lr=3e-3)
    diloco = DiLoCo(model, inner, sync_every=a.sync_every, algorithm=a.algorithm)

    first = 0
    path = a.checkpoint / f"rank{rank}.pt"
    if a.resume:
        sd = torch.load(path, map_location=device, weights_only=False)
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["inner"])
        diloco.load_state_dict(sd["diloco"])
        first = sd["step"] + 1

    with diloco:
        for step, x, y in batches(rank, range(first, first + a.steps), device):
            inner.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            inner.step()  # every sync_every steps the outer sync runs here
            if rank == 0 and (step + 1) % (4 * a.sync_every) == 0:
                print(f"step {step + 1}: loss {loss.item():.4f}, {diloco.stats.syncs} syncs, "
                      f"{diloco.stats.sent_bytes / 2**20:.2f} MiB sent "
                      f"({diloco.stats.raw_bytes / 2**20:.2f} MiB uncompressed)")  # fmt: skip

    a.checkpoint.mkdir(exist_ok=True)
    torch.save({"model": model.state_dict(), "inner": inner.state_dict(),
                "diloco": diloco.state_dict(), "step": step}, path)  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
