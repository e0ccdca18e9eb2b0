"""The toy job every integration test trains: a small MLP on fixed data, 2 ranks.

Each compressed weight has >= 256 elements, so with :data:`RULE` the onebit runs compress them
(the default rule leaves tensors under 65536 elements uncompressed).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import TensorDataset

from hipress.casync import DefaultRule

RULE = DefaultRule(min_compress_numel=256)
BATCH = 8
SAMPLES = 64  # 4 batches per rank and epoch


def net() -> torch.nn.Module:
    """The model, initialised the same way in every run."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))


def dataset() -> TensorDataset:
    """Fixed inputs and targets."""
    g = torch.Generator().manual_seed(1)
    return TensorDataset(
        torch.randn(SAMPLES, 32, generator=g), torch.randn(SAMPLES, 8, generator=g)
    )


def save_params(module: torch.nn.Module, out: Path, name: str, **extra: object) -> None:
    """Write this rank's parameters (and ``extra``) to ``out/name-rank{r}.pt``."""
    params = {n: p.detach().clone() for n, p in module.named_parameters()}
    torch.save({"params": params, **extra}, out / f"{name}-rank{dist.get_rank()}.pt")
