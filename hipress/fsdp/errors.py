"""Exceptions raised by :mod:`hipress.fsdp`.

Every error a user can cause (a model without ``fully_shard``, an unknown algorithm, a feedback
option the algorithm cannot use, a checkpoint from another configuration) is a
:class:`FsdpError`, with a message that says what is wrong and what to do. It derives from
:class:`~hipress.codec.errors.CaSyncError`, so code that catches CaSync's errors catches these.
"""

from __future__ import annotations

from hipress.codec.errors import CaSyncError

__all__ = ["FsdpError"]


class FsdpError(CaSyncError):
    """hipress over FSDP2 was misconfigured, or a checkpoint does not fit this configuration."""
