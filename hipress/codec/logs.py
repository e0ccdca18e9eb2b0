"""Log records that name their rank.

:data:`RANK_FILTER` is added to every logger of CaSync and of the codec layer: once
``torch.distributed`` is initialised, it prefixes each record's message with ``[rank R]`` and
sets ``record.rank`` (for a format's ``%(rank)s``), so the lines of many workers in one log can
be told apart.
"""

from __future__ import annotations

import logging

import torch.distributed as dist

__all__ = ["RANK_FILTER", "RankFilter"]


class RankFilter(logging.Filter):
    """Prefix a record's message with its process's rank (never drops a record)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if hasattr(record, "rank"):  # (already seen: a record passes a logger's filter once)
            return True
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else None
        record.rank = "-" if rank is None else rank
        if rank is not None:
            record.msg = f"[rank {rank}] {record.msg}"
        return True


RANK_FILTER = RankFilter()
