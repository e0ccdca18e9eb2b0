"""Lightning runs for tests/test_integrations_lightning.py: ``python lightning_train.py OUT MODE``.

Lightning's ``ddp`` strategy starts rank 1 by running this script again. MODE ``full`` trains
3 epochs without hipress, with ``algorithm=None``, with onebit, 1 epoch with onebit followed by
a checkpoint, and 3 epochs with onebit in a plain DDP loop (no Lightning); MODE ``resume``
resumes the checkpoint to epoch 3 (with ``plan="auto"``, which takes the saved plan). Each run
writes ``OUT/<run>-rank<r>.pt``. MODE ``peer-dies``: rank 1 exits in its third step, and rank 0,
under ``OnExceptionCheckpoint``, writes ``OUT/emergency.ckpt`` and what ``fit`` raised to
``OUT/died-rank0.pt``.
"""

from __future__ import annotations

import faulthandler
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import toy
from lightning.pytorch.callbacks import OnExceptionCheckpoint
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.strategies import DDPStrategy
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

import hipress.casync
from hipress.integrations.lightning import HipressCallback

EPOCHS = 3


class Module(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = toy.net()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, _: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    def train_dataloader(self) -> DataLoader:
        return loader()


def loader() -> DataLoader:
    """This rank's batches, in order (the same for Lightning and the plain DDP loop)."""
    data = toy.dataset()
    return DataLoader(data, batch_size=toy.BATCH, sampler=DistributedSampler(data, shuffle=False))


def fit(
    out: Path,
    name: str,
    epochs: int,
    callback: HipressCallback | None = None,
    ckpt_path: Path | None = None,
    logger: Any = False,
) -> pl.Trainer:
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=epochs, logger=logger,
        log_every_n_steps=1,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        use_distributed_sampler=False, callbacks=[callback] if callback else [],
    )  # fmt: skip
    module = Module()
    trainer.fit(module, ckpt_path=ckpt_path)
    extra = {}
    if callback is not None and callback.state is not None:
        last = callback.state.stats.last
        extra = {"sent": last.bytes_sent, "uncompressed": last.bytes_uncompressed,
                 "kept": dict(callback.state.plan.meta.get("kept_plain", {})),
                 "logged": {k: float(v) for k, v in trainer.logged_metrics.items()}}  # fmt: skip
    toy.save_params(module, out, name, **extra)
    return trainer


class Dying(Module):
    """Rank 1 exits at the start of its third step, as a crashed peer would."""

    def training_step(self, batch: Any, i: int) -> torch.Tensor:
        if self.global_step == 2 and self.trainer.global_rank == 1:
            os._exit(3)
        return super().training_step(batch, i)


def peer_dies(out: Path) -> None:
    """Train until rank 1 dies; rank 0 records what ``fit`` raised (and the exceptions it
    chains) and exits at once, as a supervisor would see it. A rank still running after 120 s
    prints every thread's stack and exits (a hang fails the test, never CI)."""
    faulthandler.dump_traceback_later(60, exit=True)
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy=DDPStrategy(timeout=timedelta(seconds=60)),
        max_epochs=EPOCHS, logger=False, default_root_dir=out, enable_progress_bar=False,
        enable_model_summary=False, use_distributed_sampler=False,
        callbacks=[HipressCallback("onebit", rule=toy.RULE),
                   OnExceptionCheckpoint(dirpath=out, filename="emergency")],
    )  # fmt: skip
    try:
        trainer.fit(Dying())
    except BaseException as exc:  # (what the test examines)
        chain: list[str] = []
        seen: set[int] = set()
        e: BaseException | None = exc
        while e is not None and id(e) not in seen:  # (a chain may loop)
            seen.add(id(e))
            chain.append(f"{type(e).__name__}: {e}")
            e = e.__cause__ or e.__context__
        torch.save({"error": type(exc).__name__, "message": str(exc), "chain": chain},
                   out / "died-rank0.pt")  # fmt: skip
        print(f"rank 0: fit raised {type(exc).__name__}: {exc}", flush=True)
        os._exit(0)
    os._exit(4)  # (fit must not end normally with a peer gone)


def plain_ddp(out: Path, name: str, algorithm: str | None) -> None:
    """The same job in a plain DDP loop with hipress.casync.register: the expected result."""
    module = Module()
    ddp = DistributedDataParallel(module)
    if algorithm:
        hipress.casync.register(ddp, algorithm, rule=toy.RULE)
    opt = module.configure_optimizers()
    for _ in range(EPOCHS):
        for x, y in loader():
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
    toy.save_params(module, out, name)


def main(out: Path, mode: str) -> None:
    ckpt = out / "epoch1.ckpt"
    if mode == "peer-dies":
        peer_dies(out)
    elif mode == "full":
        fit(out, "plain", EPOCHS)
        fit(out, "none", EPOCHS, HipressCallback(None))
        # (exclude= names the biases, which the rule keeps plain anyway: same numbers)
        csv = CSVLogger(out, name="csv", version=0)  # (the metrics' file: out/csv/version_0)
        fit(out, "onebit", EPOCHS, HipressCallback("onebit", rule=toy.RULE, exclude="*.bias"),
            logger=csv)  # fmt: skip
        fit(out, "first", 1, HipressCallback("onebit", rule=toy.RULE)).save_checkpoint(ckpt)
        plain_ddp(out, "manual", "onebit")
        plain_ddp(out, "manual-plain", None)
    else:
        # plan="auto": the callback takes the checkpoint's plan, measuring nothing
        fit(out, "resumed", EPOCHS, HipressCallback("onebit", plan="auto"), ckpt_path=ckpt)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
