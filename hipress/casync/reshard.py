"""CaSync compression state saved at N ranks, made into one rank's state dict at M ranks.

Per element of every compressed parameter, what the workers have not sent (the sum over the N
ranks' worker states that cover it) is divided equally among the ranks that keep a worker state
for it at M (all M; RING: all but the shard's owner), and what the server of its shard has not
sent goes whole to the server of its shard at M. The sums over ranks are so preserved up to
float rounding (they are formed in float64; each share is rounded once to the state's dtype).
A state of an algorithm whose mass is not known (:mod:`hipress.codec.residual`) starts afresh,
with a logged reason. RNG counters: each new state keeps its own stream and key, at the step the
saved chunk had reached.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from hipress.casync.config import FORMAT
from hipress.casync.runtime import Runtime
from hipress.codec.errors import CaSyncError
from hipress.codec.logs import RANK_FILTER
from hipress.codec.residual import can_reshard, mass_of, with_mass
from hipress.core.layout import ChunkLayout, layout_plan
from hipress.core.plan import Plan, Strategy

logger = logging.getLogger(__name__)
logger.addFilter(RANK_FILTER)

__all__ = ["reshard"]


def _spans(c: ChunkLayout, rank: int, world_size: int) -> list[tuple[str, int, int, bool]]:
    """``(key, start, stop, server)`` of every state ``rank`` keeps for chunk ``c``, the span
    in chunk elements."""
    shard_of = {c.shard_key(j): j for j in range(len(c.shards))}
    shard_of.update({c.shard_key(j, server=True): j for j in range(len(c.shards))})
    out = []
    for key, n, server in c.states(rank, world_size):
        start = c.shard_starts[shard_of[key]] if key in shard_of else 0
        out.append((key, start, start + n, server))
    return out


def _holders(c: ChunkLayout, world_size: int) -> int:
    """How many ranks keep a worker state for an element of ``c``."""
    return world_size - 1 if c.strategy is Strategy.RING else world_size


def reshard(
    rt: Runtime, entries: Sequence[Mapping[str, Any] | None], saved: Plan, *, rank: int,
    world_size: int,
) -> dict[str, Any]:  # fmt: skip
    """Rank ``rank``'s state dict at ``world_size`` ranks from the N saved ``entries`` (rank
    order; None: a rank missing from the checkpoint, which adds nothing) of ``saved`` (the plan
    as saved). Its ``config`` is ``rt``'s; everything else is checked by the loader."""
    alg = rt.ctx.algorithm
    n_old = len(entries)
    old = layout_plan(saved, n_old, alg.payload_nbytes)
    new = layout_plan(rt.base_plan, world_size, alg.payload_nbytes)
    mine = rt.parts()
    out: dict[str, Any] = {"format": FORMAT, "rank": rank, "world_size": world_size,
                           "config": dict(rt.config), "worker": {}, "server": {}}  # fmt: skip
    reset: list[str] = []
    for c_new in new.all_chunks():
        c_old = next(c for c in old[c_new.name] if c.part == c_new.part)
        found = _gather(c_old, entries, saved)
        if found is None:
            reset.append(c_new.key)
        for key, start, stop, server in _spans(c_new, rank, world_size):
            part = "server" if server else "worker"
            sd = mine[part][key].state_dict()
            if found is not None:
                sums, step = found
                share = 1 if server else _holders(c_new, world_size)
                mass = {m: v[1 if server else 0][start:stop] / share for m, v in sums.items()}
                sd["tensors"] = with_mass(alg.name, sd["tensors"], mass)
                sd["step"] = step
            out[part][key] = sd
    if reset:
        logger.warning(
            "casync: %s keeps no state hipress can move between world sizes: %d chunk(s) start "
            "afresh (%s)", alg.name, len(reset), ", ".join(reset[:4]) + ("..." if len(reset) > 4
                                                                       else ""),
        )  # fmt: skip
    return out


def _gather(
    c: ChunkLayout, entries: Sequence[Mapping[str, Any] | None], saved: Plan
) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], int] | None:
    """Chunk ``c``'s mass summed over the saved ranks, per mass name (worker sums, server
    sums) in float64, and the step its states had reached; None if it cannot be read."""
    sums: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    step = 0
    n_old = len(entries)
    for r, sd in enumerate(entries):
        if sd is None:
            continue
        for key, start, stop, server in _spans(c, r, n_old):
            part = sd.get("server" if server else "worker")
            state = part.get(key) if isinstance(part, Mapping) else None
            if not isinstance(state, Mapping) or not isinstance(state.get("tensors"), Mapping):
                raise CaSyncError(f"rank {r}'s entry: damaged CaSync state dict: no state `{key}`")
            tensors = state["tensors"]
            if not can_reshard(saved.algorithm, bool(tensors)):
                return None
            mass = mass_of(saved.algorithm, saved.params, tensors)
            assert mass is not None
            step = max(step, int(state.get("step", 0)))
            for name, v in mass.items():
                if v.numel() != stop - start:
                    raise CaSyncError(f"rank {r}'s entry: state `{key}` has {v.numel()} "
                                      f"elements, its shard {stop - start}")  # fmt: skip
                w, s = sums.setdefault(name, (torch.zeros(c.numel, dtype=torch.float64),
                                              torch.zeros(c.numel, dtype=torch.float64)))  # fmt: skip
                (s if server else w)[start:stop] += v.double()
    return sums, step
