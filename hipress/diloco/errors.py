"""The exceptions of :mod:`hipress.diloco`.

Every error a user can cause (a bad argument, a checkpoint from another configuration, ranks
configured differently) or a failing peer causes is one of these, with a message that says
what is wrong and what to do. They derive from :mod:`hipress.codec.errors`, so code that
catches the codec layer's errors catches these.
"""

from __future__ import annotations

from hipress.codec.errors import CaSyncError, CommError, ConfigMismatchError

__all__ = ["CommError", "ConfigMismatchError", "DiLoCoError"]


class DiLoCoError(CaSyncError):
    """Local-step training was misconfigured or misused, or a checkpoint does not fit."""
