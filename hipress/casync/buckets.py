"""A check of DDP's buckets at :func:`~hipress.casync.register`: does a large gradient ready
last hold back gradients ready before it?

DDP hands a bucket to the hook once every gradient in it is ready, and after its first step it
rebuilds its buckets in the order the gradients became ready; a bucket closes once its bytes
reach ``bucket_cap_mb`` (:mod:`hipress.secopa.model.ddpbuckets`). A gradient of at least the cap
therefore closes whatever bucket it joins, and a cap above the whole model puts everything in
one bucket: the gradients that joined the bucket before it wait for it, and when it is ready
last in backward (an LM's input embedding) their bytes leave only once backward ends.
:func:`check_buckets` predicts the layout from the parameters in reverse registration order
(DDP's own assumption about the ready order, and the order backward usually follows) and DDP's
caps, and logs, once on rank 0, when the gradient ready last outweighs the others waiting for
it in the last bucket and those send 1 MB or more as the plan sends them (compressed, they
often send far less, and then their wait is short and extra buckets can cost more than it),
with the largest of SeCoPa's candidate caps that frees them; ``hipress plan --readiness FILE``
recommends one from measured ready times and costs.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from hipress.codec.logs import RANK_FILTER
from hipress.secopa.model.bucketcap import CANDIDATES_MB
from hipress.secopa.model.ddpbuckets import ddp_buckets, ddp_caps

__all__ = ["check_buckets", "ddp_first_bucket_mb", "first_is_cap", "late_merges"]

log = logging.getLogger(__name__)
log.addFilter(RANK_FILTER)

MIB = 2**20
WAIT_MB = 1.0  # less than this waiting is not worth a change


def first_is_cap() -> bool:
    """Whether this torch's DDP limits the first bucket by an explicitly given
    ``bucket_cap_mb`` too (torch >= 2.13: ``_BucketCapacityConfig``); else 1 MiB."""
    from torch.nn.parallel import distributed as ddp_mod

    return hasattr(ddp_mod, "_BucketCapacityConfig")


def ddp_first_bucket_mb(ddp_model: Any) -> float:
    """The first bucket's limit, in MiB, of a DDP model as built."""
    config = getattr(ddp_model, "_bucket_config", None)
    if config is not None:
        return float(config.first_bucket_bytes_cap) / MIB
    return float(getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", MIB)) / MIB


def late_merges(
    named: Sequence[tuple[str, int]], cap_mb: float, first_mb: float,
    wire: Mapping[str, int] | None = None,
) -> list[dict[str, Any]]:
    """The last bucket (gradients ready in reverse order of ``named``, fp32 element counts)
    when its gradient ready last outweighs the others in it together, which send ``WAIT_MB`` or
    more (``wire``: each tensor's bytes as sent, by name; default its fp32 gradient's):
    ``name``, ``mb``, ``waiting_mb``, ``waiting_wire_mb`` and ``waiting`` (their names); else
    nothing."""
    numels = [k for _, k in named]
    out = []
    for b in ddp_buckets(numels, cap_mb, first_mb):
        if 0 not in b:  # only the bucket released at the end of backward
            continue
        last = 0  # ready last: the first registered
        others = [i for i in b if i != last]
        waiting = sum(4 * numels[i] for i in others) / MIB
        sent = waiting if wire is None else sum(wire[named[i][0]] for i in others) / MIB
        if 4 * numels[last] >= waiting * MIB and sent >= WAIT_MB:
            out.append({"name": named[last][0], "mb": 4 * numels[last] / MIB,
                        "waiting_mb": waiting, "waiting_wire_mb": sent,
                        "waiting": [named[i][0] for i in others]})  # fmt: skip
    return out


def _freeing_cap(
    named: Sequence[tuple[str, int]], first_is: bool, wire: Mapping[str, int] | None
) -> float | None:
    """The largest candidate cap with no late merge."""
    for cap in sorted(CANDIDATES_MB, reverse=True):
        caps = ddp_caps(cap, first_is)
        if not late_merges(named, caps.cap_mb, caps.first_mb, wire):
            return cap
    return None


def check_buckets(
    ddp_model: Any, named: Sequence[tuple[str, torch.nn.Parameter]],
    wire: Mapping[str, int] | None = None,
) -> list[str]:
    """Log (a warning, on rank 0: every rank's buckets are alike) each large tensor that holds
    back earlier gradients in DDP's buckets (module docstring), with what to change; returns
    the messages, on every rank. ``wire``: each tensor's bytes as the plan sends them
    (:meth:`CaSyncState.wire_nbytes`), by name."""
    cap_mb = float(getattr(ddp_model, "bucket_bytes_cap", 25 * MIB)) / MIB
    first_mb = ddp_first_bucket_mb(ddp_model)
    sizes = [(n, p.numel() * p.element_size() // 4) for n, p in named]
    merges = late_merges(sizes, cap_mb, first_mb, wire)
    fix = _freeing_cap(sizes, first_is_cap(), wire) if merges else None
    msgs = []
    for m in merges:
        how = (f"DistributedDataParallel with bucket_cap_mb={fix:g} would send them while "
               "backward runs, at the cost of more buckets" if fix is not None else
               "no bucket_cap_mb separates them")  # fmt: skip
        msgs.append(
            f"casync: DDP's bucket_cap_mb {cap_mb:g} puts {m['name']} ({m['mb']:.1f} MB, "
            f"likely ready last in backward) in one bucket with {m['waiting_mb']:.1f} MB of "
            f"gradients{_sent(m)} ready before it ({', '.join(m['waiting'][:3])}"
            f"{', ...' if len(m['waiting']) > 3 else ''}), which wait for it and leave only "
            f"when backward ends: {how} (`hipress plan --readiness FILE` prices each cap from "
            "measured ready times and recommends one)"
        )
    group = getattr(ddp_model, "process_group", None)  # (the model's group: its rank 0)
    if not dist.is_initialized() or dist.get_rank(group) == 0:
        for msg in msgs:
            log.warning(msg)
    return msgs


def _sent(merge: dict[str, Any]) -> str:
    sent = merge["waiting_wire_mb"]
    return "" if sent == merge["waiting_mb"] else f" ({sent:.1f} MB as sent)"
