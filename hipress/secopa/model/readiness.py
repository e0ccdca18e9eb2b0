"""When each gradient is ready in backward.

Backward produces gradients in an order: a network's last layers first, its first layers (an
LM's input embedding) at the very end. What a gradient puts on the link can only start once the
gradient exists: the link time of the gradients ready early can hide behind the rest of
backward, that of the gradients ready last cannot. :class:`Readiness` holds the measured ready
times (each gradient's *lead*: the ms between it being ready and backward's end, in a run where
nothing delays backward; :mod:`hipress.secopa.measure.readiness` measures them), from which
:mod:`~hipress.secopa.model.exposure` predicts the exposed time of a whole step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hipress.secopa.model.network import ProfileError

__all__ = ["Readiness"]


@dataclass(frozen=True)
class Readiness:
    """When each parameter's gradient is ready in backward.

    Fields:
        leads_ms: parameter name -> ms between its gradient being ready and the end of
            backward (>= 0; the gradient ready last has the smallest lead, near 0).
        backward_ms: ms from the first gradient ready to the end of backward (at least the
            largest lead; 0: take the largest lead).
        steps: how many backward passes the leads are the median of.
    """

    leads_ms: Mapping[str, float]
    backward_ms: float = 0.0
    steps: int = 1
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        bad = sorted(n for n, v in self.leads_ms.items() if not (math.isfinite(v) and v >= 0))
        if bad:
            raise ProfileError(f"ready-time leads must be finite and >= 0 ms, not for {bad[:5]}")
        if not (math.isfinite(self.backward_ms) and self.backward_ms >= 0):
            raise ProfileError(f"backward_ms must be finite and >= 0, got {self.backward_ms}")
        if self.steps < 1:
            raise ProfileError(f"steps must be >= 1, got {self.steps}")

    def lead(self, name: str) -> float:
        """The lead of ``name``'s gradient; 0 (ready at the end) when it was not measured."""
        return float(self.leads_ms.get(name, 0.0))

    def to_dict(self) -> dict[str, Any]:
        return {
            "leads_ms": {k: float(v) for k, v in sorted(self.leads_ms.items())},
            "backward_ms": self.backward_ms,
            "steps": self.steps,
            "meta": dict(self.meta),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Readiness:
        """Rebuild from :meth:`to_dict`; raise :class:`ProfileError` on any defect."""
        try:
            return cls(
                leads_ms={str(k): float(v) for k, v in dict(d["leads_ms"]).items()},
                backward_ms=float(d.get("backward_ms", 0.0)),
                steps=int(d.get("steps", 1)),
                meta=dict(d.get("meta", {})),
            )
        except ProfileError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ProfileError(f"malformed readiness: {type(exc).__name__}: {exc}") from None
