"""Which FSDP units may be compressed at all: a :class:`~hipress.core.rule.Selection` applied
per unit.

FSDP2 reduce-scatters a unit's gradients as one flat buffer, so a unit is compressed or not as
a whole. A unit is kept plain when one of its parameters must be (``exclude=`` names it, or it
is an embedding weight that ``include=`` does not name), or when every one of its parameters is
(1-D, or rejected by ``shapes=``). A unit that holds matrices and 1-D tensors (a transformer
block with its norms) is compressed with its 1-D tensors: to keep them plain, shard them in a
unit of their own or ``exclude=`` them (which keeps their unit plain).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence

from torch import nn

from hipress.core.rule import Selection
from hipress.fsdp.planning import UnitPlan

__all__ = ["keep_units_plain", "unit_reasons", "warn_lossy_units"]

log = logging.getLogger(__name__)
_MUST = ("excluded", "embedding")


def _owner(fqn: str, units: Sequence[str]) -> str | None:
    """The unit (a module name, ``"<root>"`` for the root) whose reduce-scatter carries the
    parameter ``fqn``: the innermost unit module that contains it."""
    best, depth = None, -1
    for u in units:
        prefix = "" if u == "<root>" else u + "."
        if fqn.startswith(prefix) and len(prefix) > depth:
            best, depth = u, len(prefix)
    return best


def unit_reasons(
    model: nn.Module, units: Sequence[str], selection: Selection, implicit: bool = True
) -> dict[str, str]:
    """``{unit: why it is kept plain}`` for the units of ``model`` (their names) that
    ``selection`` keeps plain (see the module docstring); ``implicit=False`` applies only
    ``exclude``/``shapes`` (a plan the user gave)."""
    members: dict[str, list[tuple[str, str | None]]] = {u: [] for u in units}
    for fqn, p in model.named_parameters():
        unit = _owner(fqn, units)
        if unit is not None and p.requires_grad:
            members[unit].append((fqn, selection.reason(fqn, tuple(p.shape), implicit)))
    out = {}
    for unit, params in members.items():
        must = [(n, r) for n, r in params if r is not None and r.startswith(_MUST)]
        if must:
            out[unit] = f"{must[0][0]}: {must[0][1]}"
        elif params and all(r is not None for _, r in params):
            out[unit] = f"every parameter kept plain ({params[0][0]}: {params[0][1]})"
    return out


def keep_units_plain(
    decisions: Mapping[str, UnitPlan], reasons: Mapping[str, str]
) -> dict[str, UnitPlan]:
    """``decisions`` with the units named in ``reasons`` uncompressed, their source saying why
    (``"plain: <reason>"``, shown by :meth:`FsdpPlan.table`)."""
    return {
        k: dataclasses.replace(u, compress=False, source=f"plain: {reasons[k]}")
        if u.compress and k in reasons
        else u
        for k, u in decisions.items()
    }


def warn_lossy_units(
    model: nn.Module, decisions: Mapping[str, UnitPlan], selection: Selection, algorithm: str
) -> list[str]:
    """Log one warning if a compressed unit holds an embedding weight; return those units."""
    units = list(decisions)
    hit = sorted({
        _owner(n, units) or "" for n, p in model.named_parameters()
        if selection.is_embedding(n, tuple(p.shape))
    } & {k for k, u in decisions.items() if u.compress})  # fmt: skip
    if hit:
        log.warning(
            "hipress.fsdp: %s is lossy and compresses unit%s %s, which hold%s an embedding "
            "weight: a quantised token embedding costs accuracy; keep it plain (leave it out of "
            "include=, or exclude= it)", algorithm, "s" if len(hit) > 1 else "", ", ".join(hit),
            "" if len(hit) > 1 else "s",
        )  # fmt: skip
    return hit
