"""DDP's buckets as the reducer forms them, for a given ``bucket_cap_mb``.

DistributedDataParallel groups gradients into buckets and hands each bucket to the comm hook
once every gradient in it is ready. After its first step it rebuilds the buckets in the order
the gradients became ready in that step (torch's ``Reducer::rebuild_buckets`` through
``compute_bucket_assignment_by_size``): walking the gradients in ready order, each joins the
open bucket, and the bucket closes once its bytes reach the current limit; the first limit is
the first bucket's, every later one ``bucket_cap_mb``. What is left open at the end is the
last bucket. So a bucket closes *after* the gradient that fills it: a large gradient ready last
(an LM's input embedding) shares its bucket with every gradient that joined since the previous
bucket closed, and those wait for it.

The first bucket's limit (:func:`ddp_caps`): 1 MiB with DDP's default (``bucket_cap_mb`` not
given, 25 MiB after); with ``bucket_cap_mb`` given, torch 2.13 and later use the same cap for the
first bucket (``first_is_cap``), earlier releases keep 1 MiB.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "DEFAULT_CAP_MB",
    "DEFAULT_FIRST_MB",
    "BucketCaps",
    "ddp_buckets",
    "ddp_caps",
    "ready_buckets",
    "ready_order",
]

DEFAULT_CAP_MB = 25.0  # DDP's bucket_cap_mb when none is given
DEFAULT_FIRST_MB = 1.0  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES, in MiB
MIB = 2**20


@dataclass(frozen=True)
class BucketCaps:
    """The two limits DDP's rebuild uses: ``first_mb`` for the first bucket, ``cap_mb`` after;
    ``default``: DDP's defaults (``bucket_cap_mb`` not given)."""

    cap_mb: float
    first_mb: float
    default: bool = False

    def label(self) -> str:
        if self.default:
            return f"default ({self.cap_mb:g} MB, first bucket {self.first_mb:g} MB)"
        first = "" if self.first_mb == self.cap_mb else f", first bucket {self.first_mb:g} MB"
        return f"{self.cap_mb:g} MB{first}"

    def to_dict(self) -> dict[str, object]:
        return {"bucket_cap_mb": None if self.default else self.cap_mb,
                "cap_mb": self.cap_mb, "first_bucket_mb": self.first_mb}  # fmt: skip


def ddp_caps(cap_mb: float | None, first_is_cap: bool = True) -> BucketCaps:
    """The limits of DDP built with ``bucket_cap_mb=cap_mb`` (None: not given);
    ``first_is_cap``: whether an explicit cap also limits the first bucket (torch >= 2.13)."""
    if cap_mb is None:
        return BucketCaps(DEFAULT_CAP_MB, DEFAULT_FIRST_MB, default=True)
    if not cap_mb > 0:
        raise ValueError(f"bucket_cap_mb must be > 0, got {cap_mb}")
    return BucketCaps(float(cap_mb), float(cap_mb) if first_is_cap else DEFAULT_FIRST_MB)


def ddp_buckets(
    numels: Sequence[int], bucket_cap_mb: float = 25.0, first_bucket_mb: float = 1.0
) -> list[list[int]]:
    """DDP's bucket assignment (float32) for gradients ready in reverse index order: parameter
    indices, a bucket closes once it reaches its cap (``first_bucket_mb`` for the first,
    ``bucket_cap_mb`` after)."""
    buckets: list[list[int]] = []
    cur: list[int] = []
    size, cap = 0, int(first_bucket_mb * MIB)
    for i in reversed(range(len(numels))):
        cur.append(i)
        size += 4 * numels[i]
        if size >= cap:
            buckets.append(cur)
            cur, size, cap = [], 0, int(bucket_cap_mb * MIB)
    if cur:
        buckets.append(cur)
    return buckets


def ready_order(leads: Sequence[float]) -> list[int]:
    """Parameter indices in the order their gradients become ready: the largest lead first;
    equal leads in reverse index order (DDP's order before any step)."""
    return sorted(range(len(leads)), key=lambda i: (-leads[i], -i))


def ready_buckets(
    numels: Sequence[int],
    leads: Sequence[float],
    bucket_cap_mb: float,
    first_bucket_mb: float,
) -> list[list[int]]:
    """DDP's buckets (parameter indices, in the order they run) when gradients become ready in
    the order of ``leads`` (:func:`ready_order`): the layout DDP rebuilds after its first
    step."""
    seq = ready_order(leads)[::-1]  # ddp_buckets walks from the last index down
    buckets = ddp_buckets([numels[i] for i in seq], bucket_cap_mb, first_bucket_mb)
    return [[seq[j] for j in b] for b in buckets]
