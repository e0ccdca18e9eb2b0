"""The counters a :class:`~hipress.diloco.DiLoCo` keeps of its outer syncs."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["DiLoCoStats"]


@dataclass
class DiLoCoStats:
    """Counters of this rank's outer syncs.

    Fields:
        inner_steps: inner optimizer steps seen.
        syncs: outer syncs applied (each fragment's counts once).
        sent_bytes: bytes this rank sent for them (on a ring; payloads and flags).
        raw_bytes: bytes an uncompressed all-reduce of the same outer gradients would send.
        wait_s: seconds the inner loop stood waiting for outer collectives.
        encode_s: seconds computing outer gradients, encoding them and issuing the collectives.
        decode_s: seconds decoding and averaging the received outer gradients.
        step_s: seconds in outer optimizer steps (with the anchor copies and alpha mixing).
    """

    inner_steps: int = 0
    syncs: int = 0
    sent_bytes: int = 0
    raw_bytes: int = 0
    wait_s: float = 0.0
    encode_s: float = 0.0
    decode_s: float = 0.0
    step_s: float = 0.0
    per_fragment: list[int] = field(default_factory=list)

    @property
    def outer_s(self) -> float:
        """Seconds spent in outer syncs in all: ``encode_s + wait_s + decode_s + step_s``."""
        return self.encode_s + self.wait_s + self.decode_s + self.step_s
