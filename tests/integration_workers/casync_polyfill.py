"""Stand-in for ``CaSyncState.gathered_state_dict`` and the gathered form of
``CaSyncState.load_state_dict`` while hipress.casync does not have them yet.

:func:`install` does nothing once CaSyncState has ``gathered_state_dict``: then the real API is
what the integration tests run. Delete this module when it has.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch.distributed as dist

from hipress.casync import CaSyncState

FORMAT = "casync-gathered-polyfill"


def install() -> bool:
    """Add the stand-ins to CaSyncState if it lacks them; True if it did."""
    if hasattr(CaSyncState, "gathered_state_dict"):
        return False
    per_rank_load = CaSyncState.load_state_dict

    def gathered_state_dict(self: CaSyncState) -> dict[str, Any]:
        ranks: list[Any] = [None] * self.world_size
        dist.all_gather_object(ranks, self.state_dict(), group=self.process_group)
        return {"format": FORMAT, "world_size": self.world_size, "ranks": ranks}

    def load_state_dict(self: CaSyncState, sd: Mapping[str, Any]) -> None:
        if isinstance(sd, Mapping) and sd.get("format") == FORMAT:
            sd = sd["ranks"][self.rank]
        per_rank_load(self, sd)

    CaSyncState.gathered_state_dict = gathered_state_dict  # type: ignore[attr-defined]
    CaSyncState.load_state_dict = load_state_dict  # type: ignore[method-assign]
    return True
