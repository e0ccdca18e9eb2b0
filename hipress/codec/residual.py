"""What an algorithm state holds that is not sent yet, read out of it and written into another.

Resharding (moving compression state to another world size) must keep the sum over ranks of
what the workers have not sent. The states keep it in the algorithm's own form (onebit: the
compensated gradient and the two scales it was sent with; topk: the compensated gradient and
which elements were sent), so each algorithm with error feedback has a reader, giving its
"mass" as plain float32 vectors (``residual``; dgc also its momentum ``u``), and a writer that
puts such vectors into a state so that its next encode adds exactly them. Algorithms without
state have no mass. An algorithm missing from the table (a user's own) cannot be resharded: its
states start afresh.

A reader and its writer are exact: a state written from what was read encodes any next gradient
to the same payload as the state it was read from (``tests/test_checkpoint_reshard.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

__all__ = ["mass_of", "with_mass"]

Tensors = Mapping[str, torch.Tensor]


def _lost(t: Tensors) -> bool:
    lost = t.get("lost")
    return isinstance(lost, torch.Tensor) and bool(lost.any())


def _zero_if_lost(t: Tensors, r: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(r) if _lost(t) else r


def _signed(t: Tensors, neg: str, pos: str, sign: float, chunk: int = 0
            ) -> dict[str, torch.Tensor]:  # fmt: skip
    """``comp`` less its decode: ``t[pos]`` where ``comp >= 0``, else ``sign * t[neg]``; with
    ``chunk``, the scales are one per ``chunk`` elements."""
    comp = t["comp"].float()

    def each(key: str) -> torch.Tensor:
        v = t[key].float()
        return v.repeat_interleave(chunk)[: comp.numel()] if chunk else v

    scale = torch.where(comp < 0, sign * each(neg), each(pos))
    return {"residual": _zero_if_lost(t, comp - scale)}


def _rotated_unsent(t: Tensors, comp: torch.Tensor) -> torch.Tensor:
    """dgc's and graddrop's kept elements: not (passed the threshold and taken in rotation)."""
    n = comp.numel()
    i = torch.arange(n)
    poff, plast = int(t["poff"]), int(t["plast"])
    r = torch.where(i < poff, i + (n - poff), i - poff)
    sent = (comp.abs() >= t["pthr"].float()) & (comp != 0) & (r <= plast)
    return ~sent if not _lost(t) else torch.zeros(n, dtype=torch.bool)


def _onebit(t: Tensors, params: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    return _signed(t, "pneg", "ppos", 1.0)


def _efsignsgd(t: Tensors, params: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    return _signed(t, "pscale", "pscale", -1.0)


def _blocksign(t: Tensors, params: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    return _signed(t, "pscale", "pscale", -1.0, int(params.get("chunk", 128)))


def _topk(t: Tensors, params: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    comp = t["comp"].float()
    a, pmin = comp.abs(), t["pmin"].float()
    sent = (a > pmin) | ((a == pmin) & (torch.arange(comp.numel()) <= int(t["plast"])))
    return {"residual": _zero_if_lost(t, torch.where(sent, 0.0, comp))}


def _graddrop(t: Tensors, params: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    comp = t["comp"].float()
    return {"residual": torch.where(_rotated_unsent(t, comp), comp, 0.0)}


def _dgc(t: Tensors, params: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    comp, u = t["comp"].float(), t["u"].float()
    kept = _rotated_unsent(t, comp)
    keep_u = kept | (not (bool(params.get("masking", False)) or _lost(t)))
    return {"residual": torch.where(kept, comp, 0.0), "u": torch.where(keep_u, u, 0.0)}


def _stored(t: Tensors, params: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    return {"residual": _zero_if_lost(t, t["residual"].float())}


# the entries a writer sets besides the mass: nothing marked sent, nothing lost
_FRESH: dict[str, dict[str, float]] = {
    "onebit": {"ppos": 0.0, "pneg": 0.0},
    "efsignsgd": {"pscale": 0.0},
    "blocksign": {"pscale": 0.0},
    "topk": {"pmin": float("inf"), "plast": -1},
    "graddrop": {"plast": -1, "poff": 0, "pthr": 0.0},
    "dgc": {"plast": -1, "poff": 0, "pthr": 0.0},
    "randomk": {},
    "tbq": {},
}
_READ: dict[str, Callable[[Tensors, Mapping[str, Any]], dict[str, torch.Tensor]]] = {
    "onebit": _onebit, "efsignsgd": _efsignsgd, "blocksign": _blocksign, "topk": _topk,
    "graddrop": _graddrop, "dgc": _dgc, "randomk": _stored, "tbq": _stored,
}  # fmt: skip
# the state entry each mass is written to
_TARGET = {"residual": "comp", "u": "u"}


def mass_of(
    algorithm: str, params: Mapping[str, Any], tensors: Tensors
) -> dict[str, torch.Tensor] | None:
    """The not-yet-sent mass of one state's ``tensors`` (``State.state_dict()["tensors"]``) of
    ``algorithm`` run with ``params``: name -> float32 vector; ``{}`` for a state without
    tensors; None if the algorithm is not in the table."""
    if not tensors:
        return {}
    read = _READ.get(algorithm)
    return None if read is None else read(tensors, params)


def with_mass(
    algorithm: str, tensors: Tensors, mass: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """``tensors`` (a state's, as a template for shapes and dtypes) with ``mass`` written in, so
    that the next encode adds exactly it (nothing marked sent, nothing lost)."""
    out = {k: v.clone() for k, v in tensors.items()}
    for name, value in mass.items():
        target = "residual" if algorithm in ("randomk", "tbq") and name == "residual" else None
        key = target or _TARGET[name]
        out[key] = value.to(out[key].dtype).reshape(out[key].shape)
    for name, value in _FRESH.get(algorithm, {}).items():
        out[name] = torch.full_like(out[name], value)
    if "lost" in out:
        out["lost"] = torch.zeros_like(out["lost"])
    return out


def can_reshard(algorithm: str, has_state: bool) -> bool:
    """Whether :func:`mass_of` knows ``algorithm`` (or it keeps no state tensors)."""
    return not has_state or algorithm in _READ
