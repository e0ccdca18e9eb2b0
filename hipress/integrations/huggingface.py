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

Checkpoints: at each of the Trainer's saves (``on_save``), every rank writes its compression
state (:meth:`~hipress.casync.CaSyncState.state_dict`: error feedback, step counts, the plan)
into the checkpoint's folder, ``<output_dir>/checkpoint-<step>/hipress_casync_rank<r>.pt``
(the Trainer's callbacks' own state must be JSON). ``trainer.train(resume_from_checkpoint=...)``
restores it in ``on_train_begin``, right after registering, so a resumed run continues bit for
bit; the callback learns the folder by wrapping ``trainer.train`` (without it, a run resumed at
step s looks in ``<output_dir>/checkpoint-<s>``). Saved at another number of ranks, every rank
reads every rank's file and the state is resharded (the gathered form,
:meth:`~hipress.casync.CaSyncState.load_state_dict`). A folder without hipress's files starts
the state afresh with a warning; a file that cannot be read or does not fit raises
:class:`~hipress.casync.CaSyncError` on every rank.
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path
from typing import Any

import torch.distributed as dist
import transformers
from torch.nn.parallel import DistributedDataParallel
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

import hipress.casync
from hipress.casync import CaSyncError, CaSyncState
from hipress.casync.config import check_wrapper_options
from hipress.casync.persist import RANK_FILE, read, write_file
from hipress.codec.checkpoint import gathered
from hipress.codec.outcome import agree_outcome
from hipress.codec.planning import DEFAULT_ALGORITHM
from hipress.core.compression import CompressionAlgorithm
from hipress.core.plan import Plan

__all__ = ["FILE", "HipressTrainerCallback", "register"]

logger = logging.getLogger(__name__)

FILE = RANK_FILE  # in each checkpoint-<step> folder


class HipressTrainerCallback(transformers.TrainerCallback):
    """Register CaSync on a ``Trainer``'s DDP model when training starts, and log its metrics.

    Args:
        trainer: the ``transformers.Trainer`` whose ``model_wrapped`` to register on.
        algorithm: a CompLL algorithm name, an algorithm object, or None (no compression).
        plan: ``"default"`` or None (the default rule), ``"auto"`` (SeCoPa's plan), a plan file
            or a :class:`~hipress.core.plan.Plan`.
        log_metrics: add the metrics to each of the Trainer's logs.
        checkpoint: save the compression state with the Trainer's checkpoints and restore it
            on ``resume_from_checkpoint`` (module doc).
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
        checkpoint: bool = True,
        **options: Any,
    ) -> None:
        check_wrapper_options(options, "HipressTrainerCallback", "Trainer")
        self.trainer = trainer
        self.algorithm = algorithm
        self.plan = plan
        self.log_metrics = log_metrics
        self.options = options
        self.state: CaSyncState | None = None
        self._registered_on: DistributedDataParallel | None = None
        self._last_logged = 0
        self.checkpoint = checkpoint
        self._resume: str | bool | None = None
        if checkpoint and trainer is not None:
            self._watch_train(trainer)

    def _watch_train(self, trainer: transformers.Trainer) -> None:
        """Wrap ``trainer.train`` to learn its ``resume_from_checkpoint`` (the Trainer hands
        its callbacks no path)."""
        original = trainer.train

        @functools.wraps(original)
        def train(resume_from_checkpoint: str | bool | None = None, *args: Any,
                  **kwargs: Any) -> Any:  # fmt: skip
            self._resume = resume_from_checkpoint
            return original(resume_from_checkpoint, *args, **kwargs)

        trainer.train = train  # type: ignore[method-assign]

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
        if state.global_step > 0 and self.checkpoint:
            self._restore(self._folder(args, state.global_step))
        elif state.global_step > 0:
            logger.info("hipress: training resumes at step %d with all-zero compression state "
                        "(checkpoint=False)", state.global_step)  # fmt: skip

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Write this rank's compression state into the checkpoint the Trainer just saved."""
        if self.state is None or not self.checkpoint:
            return
        folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        folder.mkdir(parents=True, exist_ok=True)
        write_file(self.state.state_dict(), folder / FILE.format(rank=self.state.rank))

    def _folder(self, args: Any, step: int) -> Path:
        """The checkpoint folder training resumes from."""
        resume = self._resume
        if resume is True:
            resume = get_last_checkpoint(args.output_dir)
        if isinstance(resume, str | os.PathLike):
            return Path(resume)
        return Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{step}"

    def _restore(self, folder: Path) -> None:
        """Load the compression state saved in ``folder``, every rank or none (see the module
        doc); the ranks agree on the outcome, so none trains on while another stopped."""
        assert self.state is not None
        error: Exception | None = None
        sd = None
        try:
            sd = _saved_state(folder, self.state.rank, dist.get_world_size())
            if sd is not None:
                self.state.load_state_dict(sd)
        except Exception as exc:  # (any: the other ranks must learn of it, not wait for it)
            error = exc
        agree_outcome(error, what=f"restoring the compression state from {folder}",
                      advice="resume from a checkpoint every rank can read")  # fmt: skip
        if sd is None:
            logger.warning("hipress: %s holds no compression state (%s): training resumes "
                           "with all-zero error feedback", folder,
                           FILE.format(rank="<r>"))  # fmt: skip
        else:
            logger.info("hipress: compression state restored from %s", folder)

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


def _saved_state(folder: Path, rank: int, world_size: int) -> Any:
    """What ``rank`` loads from ``folder``: its own file's state dict where the files were
    saved at ``world_size`` ranks, else every rank's in the gathered form (which
    ``load_state_dict`` reshards); None if the folder holds no file of hipress's."""
    files = {int(p.stem.rsplit("rank", 1)[1]): p
             for p in folder.glob(FILE.format(rank="*")) if p.stem.rsplit("rank", 1)[1].isdigit()}  # fmt: skip
    if not files:
        return None
    first = read(files[rank] if rank in files else files[min(files)])
    saved = first.get("world_size") if isinstance(first, dict) else None
    if not isinstance(saved, int) or saved < 1:
        raise CaSyncError(f"{folder}: {FILE.format(rank='<r>')} holds no CaSync state dict")
    if saved == world_size and rank in files:
        return first
    entries = [read(files[r]) if r in files else None for r in range(saved)]
    sd = gathered(entries, saved)
    sd["missing"] = [r for r, e in enumerate(entries) if e is None]
    return sd


def register(
    trainer: transformers.Trainer,
    algorithm: str | CompressionAlgorithm | None = DEFAULT_ALGORITHM,
    *,
    plan: Plan | str | Path | None = None,
    log_metrics: bool = True,
    checkpoint: bool = True,
    **options: Any,
) -> HipressTrainerCallback:
    """Add a :class:`HipressTrainerCallback` to ``trainer``, first among its callbacks (so
    each log reaches the ``report_to`` integrations with the metrics in it); return it.

    Call on every rank before ``trainer.train()``; the arguments are the callback's. Its
    ``state`` exists once training starts.
    """
    callback = HipressTrainerCallback(
        trainer, algorithm, plan=plan, log_metrics=log_metrics, checkpoint=checkpoint, **options
    )
    trainer.callback_handler.callbacks.insert(0, callback)
    return callback
