"""Every rank raises together: :func:`agree_outcome`.

A step that can fail on one rank alone (a setup, a checkpoint's load, a restore) and is followed
by collectives must not leave the other ranks to wait for that rank until the process group
times out, nor let them train on while it stopped. So after such a step every rank sends its
outcome, ``(rank, failure or None)``, to every other (one ``all_gather_object`` over the
group); a rank that failed raises its own error, and every other rank raises the same typed
error naming each rank that failed and why::

    <what> failed on rank 1; <advice>:
      rank 1: <the error's type>: <its message>

The messages of the failures say the rest (which file, which tensor).
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from hipress.codec.errors import CaSyncError, CommError

__all__ = ["agree_outcome", "describe"]


def describe(error: BaseException) -> str:
    """One rank's failure as the other ranks show it: ``"<type name>: <message>"``."""
    return f"{type(error).__name__}: {error}"


def agree_outcome(
    error: BaseException | None,
    *,
    what: str,
    advice: str,
    kind: type[CaSyncError] = CaSyncError,
    group: dist.ProcessGroup | None = None,
    payload: Any = None,
) -> list[Any]:
    """Exchange this rank's outcome (``error``, None if it succeeded) with every rank of
    ``group`` (default: the default group), and raise on every rank if any failed: this rank's
    own ``error`` on this rank, and on the others ``kind`` (a :class:`CaSyncError`) whose
    message says ``what`` failed on which ranks and why (module doc), then ``advice``.

    ``payload`` (anything picklable) travels with the outcome in the same collective; returns
    every rank's payload in the group's rank order when no rank failed (``[payload]`` without
    an initialised process group, where nothing is exchanged). Raises
    :class:`~hipress.codec.errors.CommError` if the exchange itself fails (a rank exited, or
    does not make this call). A collective: every rank of ``group`` calls it, failed or not."""
    if not (dist.is_available() and dist.is_initialized()):
        if error is not None:
            raise error
        return [payload]
    mine = None if error is None else describe(error)
    every: list[Any] = [None] * dist.get_world_size(group)
    try:
        dist.all_gather_object(every, (dist.get_rank(), mine, payload), group=group)
    except Exception as exc:  # gloo/NCCL error: a peer died or timed out
        raise CommError(
            f"{what}: every rank's outcome could not be gathered (did a rank exit, or not "
            f"reach this step?): {describe(exc)}"
        ) from exc
    if error is not None:
        raise error
    failed = [(r, m) for r, m, _ in every if m is not None]
    if failed:
        ranks = ", ".join(str(r) for r, _ in failed)
        lines = "\n".join(f"  rank {r}: {m}" for r, m in failed)
        plural = "s" if len(failed) > 1 else ""
        raise kind(f"{what} failed on rank{plural} {ranks}; {advice}:\n{lines}")
    return [p for _, _, p in every]
