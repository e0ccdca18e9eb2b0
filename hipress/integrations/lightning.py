"""hipress in PyTorch Lightning: :class:`HipressCallback`.

Use::

    from hipress.integrations.lightning import HipressCallback

    trainer = lightning.Trainer(strategy="ddp", callbacks=[HipressCallback("onebit")])

Why a callback and not ``DDPStrategy(ddp_comm_hook=...)``: Lightning's ``DDPStrategy`` registers
a comm hook only when ``root_device.type == "cuda"``, so on CPUs (gloo) the hook would be
silently left out. The callback registers on the strategy's ``DistributedDataParallel`` object
in ``on_fit_start``, which runs after the strategy wrapped the model and before the first
backward, on CPUs and GPUs alike, with any launcher (``ddp``, ``ddp_spawn``, torchrun, SLURM).

Checkpoints: Lightning writes its checkpoint from rank 0 only, while compression state differs
per rank. The callback's :meth:`~HipressCallback.state_dict` therefore gathers every rank's
state (a collective: Lightning calls it on every rank when saving) and stores it in the
checkpoint; on resume each rank loads its own. After a peer exited (CaSync raised
:class:`~hipress.casync.CommError`), an emergency checkpoint (``OnExceptionCheckpoint``) holds
what rank 0 has, its own state, and the log says which ranks are missing; those resume with
their states as they are.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import hipress.casync
from hipress.casync import CaSyncError, CaSyncState
from hipress.casync.config import check_wrapper_options
from hipress.codec.planning import DEFAULT_ALGORITHM
from hipress.core.compression import CompressionAlgorithm
from hipress.core.plan import Plan

__all__ = ["HipressCallback"]

logger = logging.getLogger(__name__)


class HipressCallback(pl.Callback):
    """Register CaSync on the DDP model of a Lightning ``Trainer``, and checkpoint its state.

    Args:
        algorithm: a CompLL algorithm name, an algorithm object, or None (no compression).
        plan: ``"default"`` or None (the default rule), ``"auto"`` (SeCoPa's plan), a plan file
            or a :class:`~hipress.core.plan.Plan`.
            With ``"auto"``, a run resumed from a checkpoint takes the plan saved in it instead
            of measuring again: a new measurement may plan differently, and the saved states
            would not match it.
        log_metrics: log this rank's :meth:`~hipress.casync.CaSyncState.metrics`
            (``hipress/bytes_ratio``, ``hipress/encode_ms``, ...) after every training batch
            through ``pl_module.log_dict``, so the trainer's loggers receive them (every
            ``log_every_n_steps``; docs/reference/metrics.md).
        options: the keyword arguments of :func:`hipress.casync.register` (``params``,
            ``seed``, ``warmup_steps``, ``rule``, ``include``/``exclude``/``shapes``, ...),
            the same on every rank.

    Fields:
        state: the :class:`~hipress.casync.CaSyncState` of the current ``fit`` on this rank
            (statistics in ``state.stats``), None before the first ``fit`` starts.

    Use with a strategy that wraps the model in ``DistributedDataParallel`` (``"ddp"``,
    ``"ddp_spawn"``, ``"ddp_notebook"``, a ``DDPStrategy``); any other raises
    :class:`~hipress.casync.CaSyncError` when ``fit`` starts. Each ``fit`` registers anew on
    the DDP model it creates; resume through ``fit(ckpt_path=...)``.
    """

    def __init__(
        self,
        algorithm: str | CompressionAlgorithm | None = DEFAULT_ALGORITHM,
        *,
        plan: Plan | str | Path | None = None,
        log_metrics: bool = True,
        **options: Any,
    ) -> None:
        check_wrapper_options(options, "HipressCallback", "strategy")
        self.algorithm = algorithm
        self.plan = plan
        self.log_metrics = log_metrics
        self.options = options
        self.state: CaSyncState | None = None
        self._pending: Mapping[str, Any] | None = None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Register CaSync on the strategy's DDP model (wrapped by now, not yet trained), and
        restore the compression state of a checkpoint ``fit`` resumes from."""
        ddp = trainer.strategy.model
        if not isinstance(ddp, DistributedDataParallel):
            raise CaSyncError(
                f"HipressCallback needs a strategy that wraps the model in "
                f'DistributedDataParallel (e.g. strategy="ddp"), got '
                f"{type(trainer.strategy).__name__} whose model is a {type(ddp).__name__}; "
                "for FSDP2 (ModelParallelStrategy), call hipress.fsdp.register in "
                "configure_model after fully_shard instead (docs/how-to/frameworks.md)"
            )
        pending, self._pending = self._pending, None
        self.state = hipress.casync.register(ddp, self.algorithm, plan=self.plan, **self.options)
        if pending is not None:  # before the first step: an "auto" plan is not made yet
            self.state.load_state_dict(pending)
            logger.info("hipress: compression state restored from the checkpoint")

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
        batch_idx: int,
    ) -> None:  # fmt: skip
        """Log the latest step's metrics (``log_metrics``) through ``pl_module.log_dict``."""
        if not self.log_metrics or self.state is None:
            return
        metrics = self.state.metrics()
        if metrics:  # (none before the first step closes, or with an "auto" plan not yet made)
            pl_module.log_dict(metrics, on_step=True, on_epoch=False, batch_size=1)

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        """After CaSync's :class:`~hipress.casync.CommError` (a peer exited or stalled), end
        this rank's part in the broken process group, so that Lightning's own barriers (after
        an ``OnExceptionCheckpoint`` writes) return at once instead of raising the backend's
        error in place of the CommError, or waiting out the group's timeout."""
        state = self.state
        if state is None or state.comm_error is None or not dist.is_initialized():
            return
        if state.process_group not in (None, dist.group.WORLD):
            return  # (not the group Lightning's barriers use)
        logger.warning(
            "hipress: a peer is gone (%s); leaving the process group so that the checkpoint "
            "callbacks can still write this rank's files", state.comm_error,
        )  # fmt: skip
        dist.destroy_process_group()

    def state_dict(self) -> dict[str, Any]:
        """Every rank's compression state (:meth:`CaSyncState.gathered_state_dict`, with the
        plan), for the checkpoint. A collective: Lightning calls it on every rank when it
        saves, and rank 0 writes the file; after a peer is gone, this rank's only."""
        if self.state is None:  # no fit has started: keep what a resumed checkpoint held
            return dict(self._pending) if self._pending is not None else {}
        return self.state.gathered_state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep a checkpoint's state until ``on_fit_start`` registers (Lightning restores
        callbacks before the strategy wraps the model); each rank then loads its own."""
        if not isinstance(state_dict, Mapping):
            raise CaSyncError(
                f"the checkpoint's HipressCallback state is a {type(state_dict).__name__}, not a "
                "CaSync state dict"
            )
        if state_dict:  # (empty: saved before any fit started)
            self._pending = dict(state_dict)
