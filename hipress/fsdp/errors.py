"""Exceptions raised by :mod:`hipress.fsdp`.

Every error a user can cause (a model without ``fully_shard``, an unknown algorithm, a feedback
option the algorithm cannot use, a checkpoint from another configuration) is a
:class:`FsdpError`, with a message that says what is wrong and what to do. It derives from
:class:`~hipress.codec.errors.CaSyncError`, so code that catches CaSync's errors catches these.
"""

from __future__ import annotations

from hipress.codec.errors import CaSyncError, ConfigMismatchError

__all__ = ["FsdpConfigMismatchError", "FsdpError"]


class FsdpError(CaSyncError):
    """hipress over FSDP2 was misconfigured, or a checkpoint does not fit this configuration."""


class FsdpConfigMismatchError(FsdpError, ConfigMismatchError):
    """Ranks registered different configurations (algorithm, parameters, feedback, sizes,
    plan, reduce dtype, ...). Raised by :func:`~hipress.fsdp.register` on every rank before
    the first compressed collective; also a :class:`~hipress.codec.errors.ConfigMismatchError`,
    as CaSync raises for the same mistake."""
