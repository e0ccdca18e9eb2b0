"""Non-finite flags, decided where the data is: on the host for CPU buffers, on the device for
CUDA ones.

CaSync marks every chunk whose input holds NaN/Inf on any rank; such a chunk comes out all-NaN
on every rank and the states that encoded it are reset. On a CPU, a flag is a Python ``bool``
(reading a CPU tensor costs nothing, and a chunk is filled or a state reset only when needed).
On a GPU, reading a flag back would synchronise the host with the device inside backward, so a
flag stays a 0-d bool tensor on the device and every decision is a device operation: a NaN fill
is ``masked_fill_`` (a pass over the chunk, a few microseconds at HBM rates) and a state reset a
masked zeroing. A :class:`FlagMode` says which applies; the engine calls the helpers below with
either kind and never branches itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Flag", "FlagMode", "all_finite"]

Flag = bool | torch.Tensor  # a Python bool, or a 0-d bool tensor on the device


def all_finite(x: torch.Tensor) -> bool:
    """Whether ``x`` holds no NaN/Inf: one read pass (min and max propagate NaN and reach
    +-Inf; much faster than ``isfinite().all()`` or a float64 sum, and no allocation)."""
    if x.numel() == 0:
        return True
    lo, hi = torch.aminmax(x)
    return bool(torch.isfinite(lo)) and bool(torch.isfinite(hi))


@dataclass(frozen=True)
class FlagMode:
    """How flags are kept for buffers on one device: ``device`` True keeps them on the device
    (CUDA; tests may force it on a CPU to check that path)."""

    device: bool

    @classmethod
    def for_tensor(cls, t: torch.Tensor, force_device: bool | None = None) -> FlagMode:
        return cls(t.is_cuda if force_device is None else force_device)

    def nonfinite(self, x: torch.Tensor) -> Flag:
        """Whether ``x`` holds NaN/Inf (one read pass)."""
        if not self.device:
            return not all_finite(x)
        if x.numel() == 0:
            return torch.zeros((), dtype=torch.bool, device=x.device)
        lo, hi = torch.aminmax(x)
        return ~(torch.isfinite(lo) & torch.isfinite(hi))

    def from_encode(self, bad: bool | torch.Tensor | None, region: torch.Tensor) -> Flag:
        """The flag of an encode's input from what the encode reported (``None``: it did not
        find out, so ``region`` is read)."""
        if bad is None:
            return self.nonfinite(region)
        if isinstance(bad, torch.Tensor):
            return bad.to(torch.bool) if self.device else bool(bad)
        return torch.tensor(bool(bad), device=region.device) if self.device else bool(bad)

    def none(self, like: torch.Tensor) -> Flag:
        return torch.zeros((), dtype=torch.bool, device=like.device) if self.device else False

    def read(self, row: torch.Tensor) -> list[Flag]:
        """The flags in a uint8 row (one byte per chunk)."""
        if self.device:
            b = row.to(torch.bool)
            return [b[k] for k in range(b.numel())]
        return [bool(v) for v in row.tolist()]

    def gathered(self, blocks: torch.Tensor, offset: int, count: int) -> list[Flag]:
        """Every rank's flags of ``count`` chunks at byte ``offset`` of each block (row), ORed."""
        return self.read(blocks[:, offset : offset + count].amax(dim=0))

    @staticmethod
    def write(rows: torch.Tensor, flags: Sequence[Flag]) -> None:
        """``flags`` into the trailer ``rows[..., :len(flags)]``, the rest of it zero."""
        rows.zero_()
        for k, f in enumerate(flags):
            if isinstance(f, torch.Tensor):
                rows[..., k] = f
            elif f:
                rows[..., k] = 1

    @staticmethod
    def either(a: Flag, b: Flag) -> Flag:
        if isinstance(a, torch.Tensor):
            return a | b
        if isinstance(b, torch.Tensor):
            return b | a
        return a or b

    @staticmethod
    def any(flags: Sequence[Flag]) -> Flag:
        out: Flag = False
        for f in flags:
            out = FlagMode.either(out, f)
        return out

    @staticmethod
    def fill_nan(region: torch.Tensor, flag: Flag) -> None:
        """``region`` all-NaN where ``flag`` is set."""
        if isinstance(flag, torch.Tensor):
            region.masked_fill_(flag, float("nan"))
        elif flag:
            region.fill_(float("nan"))

    @staticmethod
    def reset(state: Any, flag: Flag) -> None:
        """Reset ``state`` (its entries zero) where ``flag`` is set."""
        if not isinstance(flag, torch.Tensor):
            if flag:
                state.reset()
            return
        masked = getattr(state, "reset_where", None)
        if masked is not None:
            masked(flag)
        elif bool(flag):  # an algorithm without a masked reset: read the flag
            state.reset()
