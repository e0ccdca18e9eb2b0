"""The exceptions every compressed sync raises (the DDP hook, and the bases of FSDP's and
Horovod's).

Every error a user can cause, or that a failing peer causes, is one of these or derives from
them, with a message that says what went wrong and what to do. The base keeps CaSync's name, the
name users catch (``hipress.casync.CaSyncError``).
"""

from __future__ import annotations

__all__ = ["CaSyncError", "CommError", "ConfigMismatchError"]


class CaSyncError(RuntimeError):
    """Base class: a compressed sync was misconfigured or a synchronisation step failed."""


class ConfigMismatchError(CaSyncError):
    """Ranks disagree on the algorithm, its parameters, the plan or the options.

    Raised on every rank at the first synchronisation step, instead of deadlocking or exchanging
    payloads that the receivers would decode wrongly.
    """


class CommError(CaSyncError):
    """A collective failed (typically a peer died or the process group timed out)."""
