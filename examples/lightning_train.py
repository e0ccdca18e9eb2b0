"""Train a small MLP with PyTorch Lightning, gradients compressed by hipress.

Launch (Lightning starts the second CPU process itself)::

    python examples/lightning_train.py --steps 50                    # DDP + HipressCallback
    python examples/lightning_train.py --steps 50 --strategy fsdp2   # ModelParallelStrategy

``--strategy ddp`` registers the DDP hook through :class:`HipressCallback`, which also logs
``hipress/bytes_ratio`` and the other metrics to the trainer's logger (a CSV file under
``--log-dir``). ``--strategy fsdp2`` shards the model with ``fully_shard`` in
``configure_model`` (Lightning's ``ModelParallelStrategy``) and registers ``hipress.fsdp``
there. Lightning's ``FSDPStrategy`` wraps in FSDP1, which has no hook for a custom
reduce-scatter, so it is no route to hipress.
"""

from __future__ import annotations

import argparse
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch.distributed.fsdp import fully_shard

import hipress.fsdp
from hipress.casync import DefaultRule
from hipress.integrations.lightning import HipressCallback


class Regressor(pl.LightningModule):
    def __init__(self, fsdp2: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(16, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)
        )
        self.fsdp2 = fsdp2

    def configure_model(self) -> None:
        if not self.fsdp2:
            return
        mesh = self.device_mesh["data_parallel"]
        for layer in self.net:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(self.net, mesh=mesh)
        self.comp = hipress.fsdp.register(self.net, "onebit", min_compress_numel=1024)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)
        if self.fsdp2:
            self.log_dict(self.comp.metrics())
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--strategy", choices=("ddp", "fsdp2"), default="ddp")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--log-dir", default="lightning_logs")
    args = ap.parse_args()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1024, 16, generator=g)
    y = torch.sin(x @ torch.linspace(-1, 1, 16)).unsqueeze(1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32)
    fsdp2 = args.strategy == "fsdp2"
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, max_steps=args.steps, log_every_n_steps=1,
        strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)
        if fsdp2 else "ddp",
        callbacks=[] if fsdp2 else [HipressCallback(rule=DefaultRule(min_compress_numel=1024))],
        logger=pl.loggers.CSVLogger(args.log_dir), enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(Regressor(fsdp2), loader)
    if trainer.is_global_zero:
        print({k: round(float(v), 4) for k, v in trainer.logged_metrics.items()})


if __name__ == "__main__":
    main()
