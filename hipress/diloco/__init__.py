"""Local-step training (DiLoCo, Streaming DiLoCo) with any CompLL algorithm as the outer codec.

    from hipress.diloco import DiLoCo

    diloco = DiLoCo(model, inner_optimizer, sync_every=16, algorithm="blocksign")
    with diloco:
        for x, y in data:
            inner_optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            inner_optimizer.step()          # every sync_every steps the outer step runs here

Each worker takes ``sync_every`` steps of its own optimizer, then the workers average the change
of their weights (compressed, with error feedback) and an outer optimizer applies it. Built on
the codec layer (:mod:`hipress.codec`), not on the DDP hook. See docs/reference/diloco-api.md.

- :mod:`~hipress.diloco.diloco` -- :class:`DiLoCo`: the inner-step count, the outer step.
- :mod:`~hipress.diloco.fragments` -- fragments and their staggered schedule.
- :mod:`~hipress.diloco.sync` -- one fragment's outer collective (all-reduce or all-gather).
- :mod:`~hipress.diloco.coder` -- one tensor's codec and error feedback.
- :mod:`~hipress.diloco.config` -- codecs per parameter, what ranks agree on.
- :mod:`~hipress.diloco.shards` -- FSDP2 inside a replica: each rank's rows of a parameter.
- :mod:`~hipress.diloco.setup` -- the checks at construction.
- :mod:`~hipress.diloco.checkpoint` -- the state dict.
- :mod:`~hipress.diloco.stats` -- the counters of the outer syncs.
"""

from __future__ import annotations

from hipress.diloco.diloco import DiLoCo, DiLoCoStats
from hipress.diloco.errors import CommError, ConfigMismatchError, DiLoCoError

__all__ = ["CommError", "ConfigMismatchError", "DiLoCo", "DiLoCoError", "DiLoCoStats"]
