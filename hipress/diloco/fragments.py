"""How the model's parameters split into fragments, and when each fragment syncs.

A fragment is a set of parameters that is synchronised together, with one collective. With one
fragment (the default) every parameter syncs every ``sync_every`` inner steps: DiLoCo. With F
fragments (Streaming DiLoCo) fragment k syncs at the inner steps t with
``t = (k + 1) * (H // F)`` modulo ``H``: the fragments' syncs are spread evenly over each
period of ``H`` steps, so only one fragment's traffic is on the link at a time, and each
fragment still syncs once every ``H`` steps. A fragment's collective may overlap the next
``fragment_sync_delay`` (tau) inner steps: it starts at its sync step and is applied tau steps
later.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from hipress.diloco.errors import DiLoCoError

__all__ = ["Schedule", "split_fragments"]

Fragments = int | Sequence[nn.Module | Sequence[nn.Parameter]]


def split_fragments(
    named: Sequence[tuple[str, nn.Parameter]], fragments: Fragments
) -> list[list[int]]:
    """The fragments, as lists of indices into ``named`` (the model's trainable parameters in
    order).

    ``fragments`` is a count F (parameters in model order, cut into F contiguous runs of about
    equal element counts, each at least one parameter) or a sequence of modules or of parameter
    lists that together hold every trainable parameter exactly once. Raises
    :class:`DiLoCoError` otherwise."""
    if isinstance(fragments, bool) or not isinstance(fragments, int | Sequence):
        raise DiLoCoError(
            "fragments must be a count or a list of modules or parameter lists, got "
            f"{type(fragments).__name__}"
        )
    if isinstance(fragments, int):
        return _split_count(named, fragments)
    where = {id(p): i for i, (_, p) in enumerate(named)}
    owner: dict[int, int] = {}
    out: list[list[int]] = []
    for k, frag in enumerate(fragments):
        params = list(frag.parameters()) if isinstance(frag, nn.Module) else list(frag)
        mine = []
        for p in params:
            if not isinstance(p, torch.Tensor):
                raise DiLoCoError(f"fragment {k} holds a {type(p).__name__}, not a parameter")
            if not p.requires_grad:
                continue
            if id(p) not in where:
                raise DiLoCoError(f"fragment {k} holds a parameter that is not the model's")
            if id(p) in owner:
                raise DiLoCoError(
                    f"{named[where[id(p)]][0]} is in fragments {owner[id(p)]} and {k}: give each "
                    "parameter to one fragment"
                )
            owner[id(p)] = k
            mine.append(where[id(p)])
        if not mine:
            raise DiLoCoError(f"fragment {k} holds no trainable parameter")
        out.append(sorted(mine))
    left = [n for n, p in named if id(p) not in owner]
    if left:
        raise DiLoCoError(
            f"no fragment holds {left[0]}{f' and {len(left) - 1} more' if len(left) > 1 else ''}"
            ": the fragments must cover every trainable parameter"
        )
    if not out:
        raise DiLoCoError("fragments is empty: pass at least one")
    return out


def _split_count(named: Sequence[tuple[str, nn.Parameter]], count: int) -> list[list[int]]:
    if count < 1 or count > len(named):
        raise DiLoCoError(
            f"fragments={count}: the model has {len(named)} trainable parameters; pass a count "
            f"from 1 to {len(named)}"
        )
    sizes = [p.numel() for _, p in named]
    total, out, run, seen = sum(sizes), [], [], 0
    for i, n in enumerate(sizes):
        run.append(i)
        seen += n
        left_params, left_frags = len(sizes) - i - 1, count - len(out) - 1
        target = total * (len(out) + 1) / count
        if left_frags and (seen >= target or left_params == left_frags):
            out.append(run)
            run = []
    out.append(run)
    return out


@dataclass(frozen=True)
class Schedule:
    """When fragments sync: ``sync_every`` (H), ``fragments`` (F) and ``delay`` (tau)."""

    sync_every: int
    fragments: int
    delay: int

    @classmethod
    def checked(cls, sync_every: object, fragments: int, delay: object) -> Schedule:
        """The schedule, or :class:`DiLoCoError` for a bad value: H an integer >= F, tau an
        integer with 0 <= tau < H // F (a fragment's sync ends before the next one starts)."""
        if isinstance(sync_every, bool) or not isinstance(sync_every, int) or sync_every < 1:
            raise DiLoCoError(f"sync_every must be an integer >= 1, got {sync_every!r}")
        if sync_every < fragments:
            raise DiLoCoError(
                f"sync_every={sync_every} is less than the {fragments} fragments: each fragment "
                "needs its own step; raise sync_every or use fewer fragments"
            )
        gap = sync_every // fragments
        if isinstance(delay, bool) or not isinstance(delay, int) or not 0 <= delay < gap:
            raise DiLoCoError(
                f"fragment_sync_delay must be an integer from 0 to {gap - 1} (less than "
                f"sync_every // fragments = {gap}), got {delay!r}"
            )
        return cls(sync_every, fragments, delay)

    def starts(self, step: int) -> list[int]:
        """The fragments whose sync starts after inner step ``step`` (1-based)."""
        gap = self.sync_every // self.fragments
        return [k for k in range(self.fragments)
                if (step - (k + 1) * gap) % self.sync_every == 0]  # fmt: skip

    def applies(self, step: int) -> list[int]:
        """The fragments whose sync is applied after inner step ``step``."""
        return self.starts(step - self.delay) if step > self.delay else []
