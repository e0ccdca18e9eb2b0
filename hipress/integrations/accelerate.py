"""hipress in Hugging Face Accelerate: :func:`register` after ``accelerator.prepare``.

Use::

    from hipress.integrations import accelerate as hipress_accelerate

    model, opt, loader = accelerator.prepare(model, opt, loader)
    state = hipress_accelerate.register(accelerator, model, algorithm="onebit")

Why not ``DistributedDataParallelKwargs(comm_hook=...)``: Accelerate maps that field through a
table of PyTorch's built-in hooks (fp16, bf16, PowerSGD) and silently ignores any other value,
so a custom hook passed there is never registered. ``prepare`` creates the
``DistributedDataParallel`` object; registering on it afterwards, before the first backward, is
all CaSync needs.

Checkpoints: ``accelerator.save_state`` writes registered objects from the main process only,
while compression state differs per rank, and it may be called on the main process alone
(``if accelerator.is_main_process: accelerator.save_state(...)``). So nothing in it is a
collective: :func:`register` registers a :class:`GatheredCheckpoint` whose ``state_dict`` is
this rank's state (the main process's, in the checkpoint), and a ``save_state`` hook with which
every other rank that saves writes its own file beside it (``hipress_casync_rank<r>.pt``);
``accelerator.load_state`` gives each rank its own. A rank whose state the checkpoint lacks
(the main process saved alone) resumes with its states as they are, and says so in the log.

Metrics: :func:`log_metrics` hands ``state.metrics()`` (``hipress/bytes_ratio``, ...) to
``accelerator.log``, so every tracker of ``Accelerator(log_with=...)`` receives them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import accelerate
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import hipress.casync
from hipress.casync import CaSyncError, CaSyncState
from hipress.casync.persist import RANK_FILE, write_file
from hipress.codec.checkpoint import gathered, is_gathered
from hipress.codec.planning import DEFAULT_ALGORITHM
from hipress.core.compression import CompressionAlgorithm

__all__ = ["FILE", "GatheredCheckpoint", "log_metrics", "register"]

logger = logging.getLogger(__name__)

# a rank's own state file in a save_state folder (every rank but the main process's)
FILE = RANK_FILE


class GatheredCheckpoint:
    """What ``accelerator.register_for_checkpointing`` keeps of a :class:`CaSyncState`.

    ``state_dict()`` is this rank's state in the gathered form (``missing``: every other rank,
    whose states :meth:`save_hook` writes to files of their own), no collective;
    ``load_state_dict()`` restores this rank's part, all or nothing, from the gathered form or
    this rank's file, with the checks of :meth:`CaSyncState.load_state_dict` (rank, world
    size, algorithm, plan, options). Checkpoints that gathered every rank's state load too.
    """

    def __init__(self, state: CaSyncState) -> None:
        self.state = state
        self._input_dir: Path | None = None

    def _file(self, folder: str | os.PathLike[str]) -> Path:
        return Path(folder) / FILE.format(rank=self.state.rank)

    def state_dict(self) -> dict[str, Any]:
        """This rank's compression state, as the gathered form of this rank alone."""
        mine = self.state.state_dict()
        rank, n = mine["rank"], mine["world_size"]
        sd = gathered([mine if r == rank else None for r in range(n)], n)
        sd["missing"] = [r for r in range(n) if r != rank]
        return sd

    def save_hook(self, models: Any, weights: Any, output_dir: str) -> None:
        """``save_state``'s pre-hook: a rank other than the main process writes its own state
        to ``output_dir/hipress_casync_rank<r>.pt`` (the main process's goes in
        :meth:`state_dict`)."""
        if self.state.rank in (None, 0):
            return
        write_file(self.state.state_dict(), self._file(output_dir))

    def load_hook(self, models: Any, input_dir: str) -> None:
        """``load_state``'s pre-hook: remember the folder, where this rank's file may be."""
        self._input_dir = Path(input_dir)

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore this rank's compression state from :meth:`state_dict`'s result, or from
        this rank's file beside it where the result does not hold it."""
        self.state.load_state_dict(self._own(state_dict))

    def _own(self, sd: Mapping[str, Any]) -> Mapping[str, Any]:
        """``sd``, or this rank's file where ``sd`` lacks this rank's entry; at another world
        size, ``sd`` with every rank's file filled in (``load_state_dict`` reshards it)."""
        rank, ranks = self.state.rank, sd.get("ranks") if is_gathered(sd) else None
        if isinstance(ranks, list) and self._input_dir is not None and dist.is_initialized() \
                and len(ranks) != dist.get_world_size():  # fmt: skip
            filled = [e if e is not None else self._read(r, ranks) for r, e in enumerate(ranks)]
            out = gathered(filled, len(ranks))
            out["missing"] = [r for r, e in enumerate(filled) if e is None]
            return out
        lacks = isinstance(ranks, list) and rank is not None and rank < len(ranks)
        if not lacks or ranks[rank] is not None or self._input_dir is None:  # type: ignore[index]
            return sd
        own = self._read(rank, ranks)  # type: ignore[arg-type]
        return sd if own is None else own

    def _read(self, rank: int, ranks: list[Any]) -> Any:
        """Rank ``rank``'s file in the load folder, or None if absent or of another step."""
        assert self._input_dir is not None
        path = Path(self._input_dir) / FILE.format(rank=rank)
        if not path.exists():
            return None  # (the main process saved alone: load_state_dict says what is missing)
        try:
            own = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise CaSyncError(f"rank {rank}: cannot read {path}: {exc}") from exc
        steps = {e.get("step") for e in ranks if isinstance(e, Mapping)}
        if isinstance(own, Mapping) and steps and own.get("step") not in steps:
            logger.warning(
                "hipress: %s holds step %s, the checkpoint step %s: left out, as from an "
                "earlier save into the same folder", path, own.get("step"), sorted(steps),
            )  # fmt: skip
            return None
        return own


def register(
    accelerator: accelerate.Accelerator,
    model: DistributedDataParallel,
    algorithm: str | CompressionAlgorithm | None = DEFAULT_ALGORITHM,
    *,
    checkpoint: bool = True,
    **options: Any,
) -> CaSyncState:
    """Register CaSync on ``model`` as returned by ``accelerator.prepare``; return its state.

    ``options`` are :func:`hipress.casync.register`'s (``params``, ``plan``, ``seed``,
    ``include``/``exclude``/``shapes``, ...), the same on every rank. With ``checkpoint`` (the default), the state is registered with
    ``accelerator.register_for_checkpointing``, so ``save_state``/``load_state`` keep it: call
    ``register`` in the same order relative to other registered objects when resuming. With
    ``plan="auto"``, ``load_state`` before the first step takes the checkpoint's plan.

    Call on every rank, after ``prepare`` and before the first backward. Raises
    :class:`~hipress.casync.CaSyncError` if ``model`` is not the prepared
    ``DistributedDataParallel`` model (e.g. a single process, where Accelerate does not wrap).
    """
    if not isinstance(model, DistributedDataParallel):
        raise CaSyncError(
            "hipress.integrations.accelerate.register needs the model returned by "
            f"accelerator.prepare wrapped in DistributedDataParallel, got a "
            f"{type(model).__name__} (distributed type {accelerator.distributed_type}): "
            "launch more than one process (torchrun or accelerate launch; on CPUs, create "
            "the Accelerator with cpu=True) and call register after prepare"
        )
    state = hipress.casync.register(model, algorithm, **options)
    if checkpoint:
        kept = GatheredCheckpoint(state)
        accelerator.register_for_checkpointing(kept)
        accelerator.register_save_state_pre_hook(kept.save_hook)
        accelerator.register_load_state_pre_hook(kept.load_hook)
    return state


def log_metrics(
    accelerator: accelerate.Accelerator, state: CaSyncState, step: int | None = None,
    steps: int = 1,
) -> dict[str, float]:  # fmt: skip
    """Log ``state.metrics(steps)`` (:meth:`~hipress.casync.CaSyncState.metrics`) through
    ``accelerator.log(..., step=step)``: every tracker of ``log_with`` receives it (Accelerate
    logs from the main process, i.e. the main process's figures). Returns the metrics logged.
    Call after ``accelerator.init_trackers`` and after a step, on every rank."""
    metrics = state.metrics(steps)
    accelerator.log(metrics, step=step)
    return metrics
