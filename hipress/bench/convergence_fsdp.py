"""The FSDP2 mode of ``hipress bench convergence`` (:mod:`~hipress.bench.convergence`): the
same job with the model sharded by ``fully_shard`` instead of replicated by DDP, its gradients
reduce-scattered plainly (float32) or compressed by :func:`hipress.fsdp.register`.

Units: the LSTM LM's embedding and LSTM each a unit, the root holding the adaptive softmax
(its forward sums the tail's parameters outside the tail's own forward, which FSDP2 has
resharded by then); the GPT's transformer blocks each a unit, untied also its token embedding
and its head, the root holding the rest (tied, the head computes with the token embedding's
matrix outside the embedding's own forward); the tabular classifier's three linear layers each
a unit. Units follow
:func:`hipress.fsdp.register`'s threshold (CaSync's default rule), so small ones stay plain.

The uncompressed warm-up of CaSync is mirrored by switching the compressed units' collectives
to FSDP2's plain reduce-scatter (their ``compress`` flag) until the first compressed step; error
feedback starts from zero then, as CaSync's does. Evaluation gathers the full parameters on
every rank into a plain copy of the model on rank 0.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from hipress.fsdp import CompressedReduceScatter, FsdpCompression

__all__ = ["FsdpRun", "shard"]


def _unit_modules(model: nn.Module, task: str) -> list[nn.Module]:
    """The modules that become FSDP units below the root, for ``task``."""
    if task == "tabular":
        return [m for m in model.modules() if isinstance(m, nn.Linear)]
    if task == "gpt":
        return list(model.blocks)  # type: ignore[arg-type]
    if task == "gpt-untied":
        return [model.embed, *model.blocks, model.head]  # type: ignore[misc]
    return [model.embed, model.lstm]  # type: ignore[list-item]


class FsdpRun:
    """One rank's sharded model and its compression (``comp``, None for plain FSDP2), with the
    warm-up switch (:meth:`pause`, :meth:`resume`) and the gather for evaluation."""

    def __init__(self, model: nn.Module, comp: FsdpCompression | None) -> None:
        self.model, self.comp = model, comp
        self._paused: list[CompressedReduceScatter] = []

    def pause(self) -> None:
        """Send every compressed unit through FSDP2's plain reduce-scatter until :meth:`resume`."""
        if self.comp is None:
            return
        self._paused = [u for u in self.comp.units.values() if u.compress]
        for u in self._paused:
            u.compress = False

    def resume(self) -> None:
        """Compress again the units :meth:`pause` switched off."""
        for u in self._paused:
            u.compress = True
        self._paused = []

    def units(self) -> dict[str, list[Any]] | None:
        """Each unit's padded element count and whether it is compressed (None for plain)."""
        if self.comp is None:
            return None
        return {k: [u.numel, u.compress or u in self._paused] for k, u in self.comp.units.items()}

    @torch.no_grad()
    def gather(self, into: nn.Module | None) -> None:
        """Copy the full parameters into ``into`` (a plain model of the same shape); every rank
        calls it (the all-gathers are collective), ranks without a copy pass None."""
        target = dict(into.named_parameters()) if into is not None else {}
        for name, p in self.model.named_parameters():
            full = p.full_tensor() if hasattr(p, "full_tensor") else p
            if into is not None:
                target[name].copy_(full)


def shard(model: nn.Module, task: str, algorithm: str | None, feedback: str, seed: int) -> FsdpRun:
    """Shard ``model`` of ``task`` with FSDP2 in place (units as the module docstring says) and,
    for an ``algorithm``, register hipress's compressed reduce-scatter with ``feedback`` and
    ``seed``. Call on every rank after ``init_process_group``."""
    from torch.distributed.fsdp import fully_shard

    # the LSTM returns a view; nothing here modifies it in place
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
    for m in _unit_modules(model, task):
        fully_shard(m)
    fully_shard(model)
    comp = None
    if algorithm is not None:
        import hipress.fsdp

        comp = hipress.fsdp.register(model, algorithm, feedback=feedback, seed=seed)
    return FsdpRun(model, comp)
