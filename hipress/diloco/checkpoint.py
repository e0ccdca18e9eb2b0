"""A :class:`~hipress.diloco.DiLoCo`'s state dict: one rank's, since anchors agree but error
feedback and codec states differ per rank.

Entries: ``format``, ``rank``, ``world_size``, ``config`` (the digest every rank agreed on),
``inner_steps`` and ``syncs`` (the counters), ``outer`` (the outer optimizer's state dict),
``anchors`` (parameter name -> the anchor weights; with FSDP2, this rank's rows; the outer
optimizer's state likewise), ``codecs`` (parameter name -> the codec's
state and feedback memory), ``pending`` (fragment -> the received buffer of a sync in flight,
waited for before saving). Loading checks everything first and changes nothing unless all of it
fits.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch

from hipress.diloco import shards
from hipress.diloco.errors import DiLoCoError
from hipress.diloco.sync import Pending

# the functions take the DiLoCo object itself (typed Any: an annotation would import
# hipress.diloco.diloco, which imports this module); they read and write its fields
DiLoCo = Any
__all__ = ["FORMAT", "load", "save"]

FORMAT = "hipress.diloco/1"


def _cpu(x: Any) -> Any:
    """A deep copy of ``x`` with every tensor on the CPU (not shared with the live state)."""
    if isinstance(x, torch.Tensor):  # a DTensor (FSDP2's outer state): this rank's rows
        return shards.local(x).to("cpu", copy=True)
    if isinstance(x, Mapping):
        return {k: _cpu(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return type(x)(_cpu(v) for v in x)
    return copy.deepcopy(x)


def save(d: DiLoCo) -> dict[str, Any]:
    """``d``'s state dict (its collectives settled by the caller)."""
    names = [n for n, _ in d.named]
    return {
        "format": FORMAT, "rank": d.rank, "world_size": d.size, "config": d.config,
        "inner_steps": d.stats.inner_steps, "syncs": list(d.stats.per_fragment),
        "outer": _cpu(d.outer.state_dict()),
        "anchors": {n: a.detach().cpu().clone() for n, a in zip(names, d.anchors, strict=True)},
        "codecs": {n: c.state_dict() for n, c in zip(names, d.coders, strict=True)},
        "pending": {k: p.buffer.cpu().clone() for k, p in enumerate(d.pending) if p is not None},
    }  # fmt: skip


def _check(d: DiLoCo, sd: Any) -> None:
    me = f"rank {d.rank}"
    if not isinstance(sd, Mapping) or sd.get("format") != FORMAT:
        got = sd.get("format") if isinstance(sd, Mapping) else type(sd).__name__
        raise DiLoCoError(f"{me}: not a DiLoCo state dict (format {got!r})")
    keys = ("rank", "world_size", "config", "inner_steps", "syncs", "outer", "anchors", "codecs",
            "pending")  # fmt: skip
    missing = [k for k in keys if k not in sd]
    if missing:
        raise DiLoCoError(f"{me}: damaged DiLoCo state dict: no {', '.join(missing)}")
    if (sd["rank"], sd["world_size"]) != (d.rank, d.size):
        raise DiLoCoError(
            f"the state dict is rank {sd['rank']} of {sd['world_size']}, this is rank {d.rank} "
            f"of {d.size}: load each rank's own state dict, with the same number of ranks"
        )
    if sd["config"] != d.config:
        raise DiLoCoError(
            f"{me}: the state dict was saved with another configuration (model, algorithm, "
            "fragments, schedule, seed or outer optimizer); resume with the same one"
        )
    names = [n for n, _ in d.named]
    for part in ("anchors", "codecs"):
        if not isinstance(sd[part], Mapping) or set(sd[part]) != set(names):
            raise DiLoCoError(f"{me}: the state dict's {part} do not match the model's parameters")
    for n, p in d.named:
        a, x = sd["anchors"][n], shards.local(p)
        if not isinstance(a, torch.Tensor) or a.shape != x.shape or a.dtype != x.dtype:
            raise DiLoCoError(f"{me}: the anchor of {n} does not fit the parameter")
    steps, syncs = sd["inner_steps"], sd["syncs"]
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise DiLoCoError(f"{me}: damaged DiLoCo state dict: inner_steps {steps!r}")
    if not isinstance(syncs, list) or len(syncs) != len(d.frags):
        raise DiLoCoError(f"{me}: damaged DiLoCo state dict: syncs {syncs!r}")
    pending = sd["pending"]
    if not isinstance(pending, Mapping):
        raise DiLoCoError(f"{me}: damaged DiLoCo state dict: pending is not a dict")
    for k, buf in pending.items():
        if not isinstance(k, int) or not 0 <= k < len(d.frags):
            raise DiLoCoError(f"{me}: damaged DiLoCo state dict: pending fragment {k!r}")
        want = d.syncs[k].received_nbytes()
        if not isinstance(buf, torch.Tensor) or buf.numel() * buf.element_size() != want:
            raise DiLoCoError(f"{me}: the pending sync of fragment {k} does not fit")


def load(d: DiLoCo, sd: Mapping[str, Any]) -> None:
    """Restore ``d`` from ``sd``, all or nothing; raises :class:`DiLoCoError`."""
    _check(d, sd)
    d.settle()
    backup = save(d)
    try:
        _restore(d, sd)
    except BaseException:
        _restore(d, backup)
        raise


def _restore(d: DiLoCo, sd: Mapping[str, Any]) -> None:
    try:
        d.outer.load_state_dict(copy.deepcopy(dict(sd["outer"])))
    except (KeyError, ValueError, TypeError, RuntimeError) as exc:
        raise DiLoCoError(
            f"rank {d.rank}: the outer optimizer's state does not fit: {exc}"
        ) from None
    shards.rewrap_state(d.outer)
    for (n, _), a, c in zip(d.named, d.anchors, d.coders, strict=True):
        a.copy_(sd["anchors"][n])
        c.load_state_dict(sd["codecs"][n], f"rank {d.rank}, {n}")
    d.stats.inner_steps = sd["inner_steps"]
    d.stats.per_fragment = list(sd["syncs"])
    d.stats.syncs = sum(d.stats.per_fragment)
    d.pending = [None] * len(d.frags)
    for k, buf in sd["pending"].items():
        d.pending[k] = Pending(buf.to(d.syncs[k].device, copy=True))
