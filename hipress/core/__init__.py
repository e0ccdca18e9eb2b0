"""The shared core, at the bottom of the layer order: the plan every layer reads, the rule that
plans when no plan is given, the layout of a compressed tensor's chunks, and the codec surface
(with :class:`Uncompressed`, "no compression" as a codec of its own). It imports nothing else
from ``hipress``.
"""

from __future__ import annotations

from hipress.core.compression import CompressionAlgorithm, Uncompressed, compresses
from hipress.core.layout import (
    ChunkLayout,
    PlanLayout,
    chunk_key,
    layout_plan,
    layout_tensor,
    split_sizes,
)
from hipress.core.plan import Plan, PlanError, Strategy, TensorPlan
from hipress.core.rule import DefaultRule

__all__ = [
    "ChunkLayout",
    "CompressionAlgorithm",
    "DefaultRule",
    "Plan",
    "PlanError",
    "PlanLayout",
    "Strategy",
    "TensorPlan",
    "Uncompressed",
    "chunk_key",
    "compresses",
    "layout_plan",
    "layout_tensor",
    "split_sizes",
]
