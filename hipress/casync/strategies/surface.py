"""What a strategy sees of the bucket operation it runs a part of: :class:`Operation` (the
surface :class:`~hipress.casync.strategies.op.BucketOp` offers) and :class:`RoundIO` (one
round's layout and buffers).

The strategies (:mod:`~hipress.casync.strategies.allreduce`,
:mod:`~hipress.casync.strategies.allgather`, :mod:`~hipress.casync.strategies.ps`,
:mod:`~hipress.casync.strategies.ring`) import this module, never the operation's, which
imports them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist

from hipress.casync.bulk import BucketSchedule, Round
from hipress.casync.strategies.context import SyncContext
from hipress.codec.errors import CaSyncError
from hipress.codec.flags import Flag, FlagMode

__all__ = ["Group", "Operation", "RoundIO"]

Group = dist.ProcessGroup | None


@dataclass(frozen=True)
class RoundIO:
    """Round ``index`` of an operation: its layout and the buffers of its layout's workspace.

    Fields:
        index: the round's index in the schedule.
        round: its layout (chunks, slots, flag positions).
        send, recv: its message buffers (see :class:`~hipress.casync.bulk.Workspace`).
        scratch: its float32 scratch.
    """

    index: int
    round: Round
    send: torch.Tensor
    recv: torch.Tensor
    scratch: torch.Tensor


class Operation(Protocol):
    """One bucket's synchronisation as a strategy uses it (see
    :class:`~hipress.casync.strategies.op.BucketOp` for what each member does)."""

    ctx: SyncContext
    schedule: BucketSchedule
    buffer: torch.Tensor
    flags: FlagMode

    @property
    def staging(self) -> torch.Tensor: ...

    def round_io(self, i: int) -> RoundIO: ...

    def encode(self, region: torch.Tensor, state: Any, out: torch.Tensor) -> Flag: ...

    def local_flags(self, rnd: Round) -> list[Flag]: ...

    def issued(self, work: Any) -> Any: ...

    def issue(
        self, launch: Callable[[], Any], nbytes: int, what: str, then: Callable[..., None],
        *args: Any,
    ) -> None: ...  # fmt: skip

    def defer(
        self, launch: Callable[[], Any], nbytes: int, what: str, then: Callable[[Group], None]
    ) -> None: ...

    def part_done(self) -> None: ...

    def fail(self, exc: BaseException, what: str = ...) -> CaSyncError: ...
