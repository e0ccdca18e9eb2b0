"""hipress in the Hugging Face ``Trainer``: :func:`register` adds a :class:`HipressTrainerCallback`.

Use::

    from hipress.integrations import huggingface as hipress_hf

    trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    hipress_hf.register(trainer, algorithm="onebit")
    trainer.train()

Launch with ``torchrun`` (or ``accelerate launch``) on more than one process; on CPUs pass
``TrainingArguments(use_cpu=True, ddp_backend="gloo")``.

Where it registers: ``Trainer.train`` wraps the model in ``DistributedDataParallel`` (through
Accelerate's ``prepare``) just before it calls the callbacks' ``on_train_begin``, and keeps the
wrapped model in ``trainer.model_wrapped``; the callbacks themselves are handed only the
unwrapped model. So the callback holds its trainer, and registers on ``trainer.model_wrapped``
in ``on_train_begin``, after the wrap and before the first backward. Every ``train()`` call
wraps anew, and the callback registers on each new wrapper.

Metrics: at each of the Trainer's logs (every ``logging_steps``), the callback adds
``state.metrics(n)`` (``hipress/bytes_ratio``, ``hipress/encode_ms``, ...; docs/reference/metrics.md)
over the ``n`` steps since the previous log to the log itself, so ``trainer.state.log_history``
and every ``report_to`` integration receive them. :func:`register` puts the callback first for
that reason: the Trainer hands one log to its callbacks in order.

Checkpoints: the Trainer's checkpoints do not hold the compression state (its callbacks'
state must be JSON); a run resumed with ``resume_from_checkpoint`` starts with all-zero
error-feedback memory, and the log says so.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import transformers
from torch.nn.parallel import DistributedDataParallel

import hipress.casync
from hipress.casync import CaSyncError, CaSyncState
from hipress.codec.planning import DEFAULT_ALGORITHM
from hipress.core.compression import CompressionAlgorithm
from hipress.core.plan import Plan

__all__ = ["HipressTrainerCallback", "register"]

logger = logging.getLogger(__name__)


class HipressTrainerCallback(transformers.TrainerCallback):
    """Register CaSync on a ``Trainer``'s DDP model when training starts, and log its metrics.

    Args:
        trainer: the ``transformers.Trainer`` whose ``model_wrapped`` to register on.
        algorithm: a CompLL algorithm name, an algorithm object, or None (no compression).
        plan: ``"default"`` or None (the default rule), ``"auto"`` (SeCoPa's plan), a plan file
            or a :class:`~hipress.core.plan.Plan`.
        log_metrics: add the metrics to each of the Trainer's logs.
        options: the keyword arguments of :func:`hipress.casync.register` (``params``,
            ``seed``, ``rule``, ``include``/``exclude``, ...), the same on every rank.

    Fields:
        state: the :class:`~hipress.casync.CaSyncState` of the current ``train()`` on this rank,
            None before training starts.
    """

    def __init__(
        self,
        trainer: transformers.Trainer,
        algorithm: str | CompressionAlgorithm | None = DEFAULT_ALGORITHM,
        *,
        plan: Plan | str | Path | None = None,
        log_metrics: bool = True,
        **options: Any,
    ) -> None:
        if options.get("process_group") is not None:
            raise CaSyncError(
                "HipressTrainerCallback synchronises over the Trainer's process group: do not "
                "pass `process_group`"
            )
        self.trainer = trainer
        self.algorithm = algorithm
        self.plan = plan
        self.log_metrics = log_metrics
        self.options = options
        self.state: CaSyncState | None = None
        self._registered_on: DistributedDataParallel | None = None
        self._last_logged = 0

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Register CaSync on ``trainer.model_wrapped``: the DDP model, wrapped by now."""
        ddp = self.trainer.model_wrapped
        if not isinstance(ddp, DistributedDataParallel):
            raise CaSyncError(
                "HipressTrainerCallback needs the Trainer's model wrapped in "
                f"DistributedDataParallel, got a {type(ddp).__name__} (parallel mode "
                f"{args.parallel_mode}): launch more than one process with torchrun (on CPUs "
                "with TrainingArguments(use_cpu=True, ddp_backend='gloo')); FSDP and DeepSpeed "
                "are not this callback's"
            )
        if ddp is self._registered_on:
            return
        self.state = hipress.casync.register(ddp, self.algorithm, plan=self.plan, **self.options)
        self._registered_on = ddp
        self._last_logged = state.global_step
        if state.global_step > 0:
            logger.info(
                "hipress: training resumes at step %d with all-zero compression state (the "
                "Trainer's checkpoints do not hold it)", state.global_step,
            )  # fmt: skip

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        """Add the metrics of the steps since the previous log to a training log (one with a
        ``loss``), and to its entry in ``state.log_history``."""
        if not self.log_metrics or self.state is None or logs is None or "loss" not in logs:
            return
        steps = max(state.global_step - self._last_logged, 1)
        self._last_logged = state.global_step
        metrics = self.state.metrics(steps)
        logs.update(metrics)
        last = state.log_history[-1] if state.log_history else None
        if isinstance(last, dict) and last.get("loss") == logs["loss"]:
            last.update(metrics)


def register(
    trainer: transformers.Trainer,
    algorithm: str | CompressionAlgorithm | None = DEFAULT_ALGORITHM,
    *,
    plan: Plan | str | Path | None = None,
    log_metrics: bool = True,
    **options: Any,
) -> HipressTrainerCallback:
    """Add a :class:`HipressTrainerCallback` to ``trainer``, first among its callbacks (so
    each log reaches the ``report_to`` integrations with the metrics in it); return it.

    Call on every rank before ``trainer.train()``; the arguments are the callback's. Its
    ``state`` exists once training starts.
    """
    callback = HipressTrainerCallback(
        trainer, algorithm, plan=plan, log_metrics=log_metrics, **options
    )
    trainer.callback_handler.callbacks.insert(0, callback)
    return callback
