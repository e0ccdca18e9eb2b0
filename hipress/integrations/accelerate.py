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
while compression state differs per rank. :func:`register` therefore registers a
:class:`GatheredCheckpoint` for checkpointing, whose ``state_dict`` gathers every rank's state
(Accelerate calls it on every rank); ``accelerator.load_state`` gives each rank its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import accelerate
from torch.nn.parallel import DistributedDataParallel

import hipress.casync
from hipress.casync import CaSyncError, CaSyncState
from hipress.core.compression import CompressionAlgorithm

__all__ = ["GatheredCheckpoint", "register"]


class GatheredCheckpoint:
    """What ``accelerator.register_for_checkpointing`` keeps of a :class:`CaSyncState`.

    ``state_dict()`` is a collective returning every rank's state dict (call it on every rank);
    ``load_state_dict()`` restores this rank's part, all or nothing, with the checks of
    :meth:`CaSyncState.load_state_dict` (rank, world size, algorithm, plan, options).
    """

    def __init__(self, state: CaSyncState) -> None:
        self.state = state

    def state_dict(self) -> dict[str, Any]:
        """Every rank's compression state (a collective)."""
        return self.state.gathered_state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore this rank's compression state from :meth:`state_dict`'s result."""
        self.state.load_state_dict(state_dict)


def register(
    accelerator: accelerate.Accelerator,
    model: DistributedDataParallel,
    algorithm: str | CompressionAlgorithm | None = "terngrad",
    *,
    checkpoint: bool = True,
    **options: Any,
) -> CaSyncState:
    """Register CaSync on ``model`` as returned by ``accelerator.prepare``; return its state.

    ``options`` are :func:`hipress.casync.register`'s (``params``, ``plan``, ``seed``, ...), the
    same on every rank. With ``checkpoint`` (the default), the state is registered with
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
        accelerator.register_for_checkpointing(GatheredCheckpoint(state))
    return state
