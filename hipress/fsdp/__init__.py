"""Compressed gradient reduction for FSDP2 (``torch.distributed.fsdp.fully_shard``).

FSDP2 reduce-scatters each unit's gradients; :func:`register` replaces that collective, on
every ``fully_shard``-ed module of a model, with a compressed one built on a CompLL algorithm:
each rank encodes the chunk bound for every other rank, one all_to_all exchanges the payloads,
and each rank decodes and sums its own shard. Error feedback is kept per unit, in the precision
chosen (:mod:`hipress.fsdp.feedback`). Which units compress is ``plan``'s: a size rule,
SeCoPa's cost model per unit (``plan="auto"``) or the user's (:mod:`hipress.fsdp.planning`).
With ``replicate_group``, each reduced shard is also averaged across replicas, compressed
(:mod:`hipress.fsdp.replicate`). See docs/how-to/fsdp.md.

    fully_shard(block) for each block; fully_shard(model)
    comp = hipress.fsdp.register(model, algorithm="onebit", feedback="bf16")
"""

from __future__ import annotations

from hipress.fsdp import checkpoint
from hipress.fsdp.collective import CompressedReduceScatter, UnitStats
from hipress.fsdp.errors import FsdpConfigMismatchError, FsdpError
from hipress.fsdp.feedback import FEEDBACK
from hipress.fsdp.planning import FsdpPlan, UnitPlan
from hipress.fsdp.register import register
from hipress.fsdp.replicate import ReplicaAllReduce
from hipress.fsdp.state import FsdpCompression

__all__ = [
    "FEEDBACK",
    "CompressedReduceScatter",
    "FsdpCompression",
    "FsdpConfigMismatchError",
    "FsdpError",
    "FsdpPlan",
    "ReplicaAllReduce",
    "UnitPlan",
    "UnitStats",
    "checkpoint",
    "register",
]
