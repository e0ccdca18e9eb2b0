"""Train a small MLP with Hugging Face Accelerate, gradients compressed by hipress.

Launch (2 CPU processes on this machine, gloo)::

    torchrun --standalone --nproc-per-node 2 examples/accelerate_train.py --steps 50

On GPUs: ``accelerate launch --multi_gpu --num_processes 2 examples/accelerate_train.py``, and
``--fsdp2`` shards the model with Accelerate's FSDP2 plugin and registers ``hipress.fsdp`` on
the prepared model. Accelerate applies its FSDP plugin on GPUs only (on CPUs it wraps the
model in DDP all the same), so ``--fsdp2`` on CPUs stops with a message.

Each step's loss and hipress's metrics go to ``accelerator.log``, which every tracker of
``Accelerator(log_with=...)`` receives (none here: the main process prints the bytes ratio).
"""

from __future__ import annotations

import argparse
import sys

import torch
from accelerate import Accelerator, FullyShardedDataParallelPlugin

import hipress.fsdp
from hipress.casync import DefaultRule
from hipress.integrations import accelerate as hipress_accelerate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--fsdp2", action="store_true")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    if args.fsdp2 and not cuda:
        sys.exit("--fsdp2: Accelerate applies its FSDP plugin on GPUs only")
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2) if args.fsdp2 else None
    accelerator = Accelerator(cpu=not cuda, fsdp_plugin=plugin)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2048, 16, generator=g)
    y = torch.sin(x @ torch.linspace(-1, 1, 16)).unsqueeze(1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    if args.fsdp2:  # the prepared model is fully_shard-ed: compress its reduce-scatters
        comp = hipress.fsdp.register(model, "onebit", min_compress_numel=1024)
        metrics = comp.metrics
    else:
        state = hipress_accelerate.register(
            accelerator, model, rule=DefaultRule(min_compress_numel=1024)
        )
        metrics = state.metrics

    for step, (xb, yb) in zip(range(args.steps), loader, strict=False):
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        opt.zero_grad()
        accelerator.backward(loss)
        opt.step()
        accelerator.log({"loss": loss.item(), **metrics()}, step=step)
        if accelerator.is_main_process and (step % 20 == 0 or step == args.steps - 1):
            ratio = metrics().get("hipress/bytes_ratio", 1.0)
            print(f"step {step:4d}  loss {loss.item():.5f}  bytes sent {ratio:.1%}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
