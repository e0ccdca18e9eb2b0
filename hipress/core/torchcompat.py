"""The torch APIs hipress calls whose spelling changed within the supported torch range.

hipress supports every torch from the oldest version ``pyproject.toml`` declares to the newest
it is tested with. Where those releases spell a call differently, the rest of hipress calls the
function here instead, and each function detects the feature (never the version string):

- :func:`reduce_scatter_single`: newer torch names the single-tensor reduce-scatter
  ``dist.reduce_scatter_single`` (and deprecates ``dist.reduce_scatter_tensor``); older torch has
  only ``reduce_scatter_tensor``.
- :func:`premul_sum_factor`: newer torch exposes a PREMUL_SUM op's factor as ``op.factor``;
  older torch only through ``op.__getstate__()``, which returns ``(RedOpType.PREMUL_SUM, factor)``.
- :func:`make_premul_sum`: newer torch builds the op as ``ReduceOp.PREMUL_SUM(factor)``; in older
  torch ``ReduceOp.PREMUL_SUM`` is a plain enum member and ``dist._make_nccl_premul_sum(factor)``
  builds it.
- :func:`fsdp_param_groups`: newer FSDP2 keeps a unit's parameter groups in
  ``FSDPState._fsdp_param_groups`` (a list); older FSDP2 keeps one group, or None, in
  ``FSDPState._fsdp_param_group``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["fsdp_param_groups", "make_premul_sum", "premul_sum_factor", "reduce_scatter_single"]


def reduce_scatter_single(
    output: torch.Tensor,
    input: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    op: Any = dist.ReduceOp.SUM,
    async_op: bool = False,
) -> dist.Work | None:
    """Reduce ``input`` (N equal rows, row j bound for rank j) over ``group`` with ``op`` and
    write this rank's row into ``output``. Returns the ``Work`` when ``async_op``, else None
    (the collective has finished on this rank)."""
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return fn(output, input, op=op, group=group, async_op=async_op)


def premul_sum_factor(op: Any) -> float | torch.Tensor | None:
    """The factor a PREMUL_SUM ``op`` multiplies by (a number or a scalar tensor); None for any
    other op, and for the bare ``ReduceOp.PREMUL_SUM`` member, which carries no factor."""
    # a ReduceOp object has .op; the bare enum members (ReduceOp.SUM, ...) do not
    if getattr(op, "op", None) != dist.ReduceOp.PREMUL_SUM:
        return None
    if hasattr(dist.ReduceOp, "factor"):
        return op.factor
    _, factor = op.__getstate__()
    return factor


def make_premul_sum(factor: float | torch.Tensor) -> dist.ReduceOp:
    """A PREMUL_SUM op that multiplies each input by ``factor`` (a number or a scalar tensor)
    before summing."""
    if not isinstance(factor, torch.Tensor):
        factor = float(factor)  # the older builder takes a float or a tensor, not an int
    premul = dist.ReduceOp.PREMUL_SUM
    if callable(premul):
        return premul(factor)
    return dist._make_nccl_premul_sum(factor)


def fsdp_param_groups(state: Any) -> list[Any]:
    """The FSDP param groups of an FSDP2 unit's ``state`` (``FSDPModule._get_fsdp_state()``):
    a list, empty for a module with no parameters of its own."""
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is not None:
        return list(groups)
    group = getattr(state, "_fsdp_param_group", None)
    return [] if group is None else [group]
