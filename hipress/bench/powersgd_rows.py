"""PowerSGD rows of the convergence benchmark: hipress's (``powersgd``, the multi-round CompLL
algorithm through ``hipress.casync.register``, DDP's default buckets, embeddings as exact rows
where sparse; ``acpsgd``, its one-round alternating variant, the same way) and PyTorch's own
(``powerSGD_hook`` with ``PowerSGDState``, one bucket, which gloo needs), all at :data:`RANK`
with warm start and error feedback, compressing from the same step."""

from __future__ import annotations

from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

__all__ = ["NAMES", "RANK", "wrap"]

NAMES = ("powersgd", "acpsgd", "powersgd-hook")
RANK = 4
# powerSGD_hook on gloo: one bucket (its rounds are not ordered across buckets)
ONE_BUCKET_MB = 4096


def wrap(model: nn.Module, name: str, start: int) -> DDP:
    """``model`` in DDP synchronised by the PowerSGD row ``name``, compressing from step
    ``start`` (at least 2, PyTorch's own lower bound with error feedback)."""
    start = max(2, start)
    if name in ("powersgd", "acpsgd"):
        import hipress.casync

        ddp = DDP(model)
        hipress.casync.register(ddp, name, params={"rank": RANK}, warmup_steps=start)
        return ddp
    if name != "powersgd-hook":
        raise ValueError(f"unknown PowerSGD row {name!r}; rows: {', '.join(NAMES)}")
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

    ddp = DDP(model, bucket_cap_mb=ONE_BUCKET_MB)
    state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=RANK,
                               start_powerSGD_iter=start, use_error_feedback=True,
                               warm_start=True)  # fmt: skip
    ddp.register_comm_hook(state, psgd.powerSGD_hook)
    return ddp
