"""Loading a ``torch.distributed.checkpoint`` that holds hipress.fsdp's state, with typed errors.

:func:`load` is ``torch.distributed.checkpoint.load`` with two guarantees on top:

- a checkpoint torch cannot read (a missing ``.metadata``, a missing or truncated ``.distcp``
  file, damaged bytes, a checkpoint saved without an entry the state dict asks for) raises an
  :class:`~hipress.fsdp.FsdpError` naming the checkpoint, the file and the reason, instead of
  torch's ``CheckpointException`` (a ``BaseException``, which ``except Exception`` misses);
- the ranks agree on the outcome: when any rank's load fails (a rank's hipress entry is
  damaged, say), every rank raises, naming the ranks and their reasons, so no rank trains on
  while another stopped.

The diagnosis reads the checkpoint's metadata and file sizes only after a failure; a load that
succeeds costs one small all-gather of the outcome more than ``dcp.load``.
"""

from __future__ import annotations

import io
import os
import re
from collections import defaultdict
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import CheckpointException, FileSystemReader
from torch.distributed.checkpoint.metadata import BytesStorageMetadata

from hipress.codec.outcome import agree_outcome
from hipress.fsdp.errors import FsdpError

__all__ = ["load"]

_MISSING_KEY = re.compile(r"Missing key in checkpoint state_dict: (\S+)\.?")


def load(state_dict: dict[str, Any], *, checkpoint_id: str | os.PathLike[str] | None = None,
         process_group: dist.ProcessGroup | None = None, **kwargs: Any) -> None:  # fmt: skip
    """``torch.distributed.checkpoint.load(state_dict, checkpoint_id=..., **kwargs)``, raising
    :class:`FsdpError` on every rank when the checkpoint cannot be loaded on any rank (see the
    module docstring). ``kwargs`` (``storage_reader``, ``planner``, ``no_dist``) go to
    ``dcp.load`` unchanged. Another exception a rank's own ``Stateful`` raises is re-raised on
    that rank; the other ranks raise :class:`FsdpError` naming it."""
    where = _where(checkpoint_id, kwargs.get("storage_reader"))
    group, local = process_group, bool(kwargs.get("no_dist", False))
    # agreed before dcp.load, so that no rank enters its collectives alone (the ranks may not
    # share a file system)
    _settle(_unreadable(checkpoint_id, kwargs), where, group, local, loaded=False)
    error: BaseException | None = None
    try:
        dcp.load(state_dict, checkpoint_id=checkpoint_id, process_group=process_group, **kwargs)
    except CheckpointException as exc:
        error = FsdpError(f"cannot load the checkpoint {where}: {_explain(exc, where)}")
    except Exception as exc:  # a Stateful's own error, hipress's FsdpError among them
        error = exc
    _settle(error, where, group, local, loaded=True)


def _unreadable(checkpoint_id: Any, kwargs: dict[str, Any]) -> FsdpError | None:
    """A local checkpoint directory whose ``.metadata`` file is missing or does not unpickle,
    found before torch looks (torch logs a traceback for each metadata file it tries); None
    when it reads, or the checkpoint is not a plain directory."""
    if checkpoint_id is None or "storage_reader" in kwargs or "://" in str(checkpoint_id):
        return None
    root = os.fspath(checkpoint_id)
    if not os.path.isdir(root):
        why = "there is no such directory"
    elif not os.path.isfile(os.path.join(root, ".metadata")):
        why = _damaged_file(root) or "it has no .metadata file"
    else:
        try:
            FileSystemReader(root).read_metadata()
            return None
        except Exception as exc:
            why = f"its .metadata file is damaged ({type(exc).__name__}: {exc})"
    return FsdpError(f"cannot load the checkpoint {root}: {why}; resume from an intact checkpoint")


def _settle(error: BaseException | None, where: str, group: dist.ProcessGroup | None,
            local: bool, loaded: bool) -> None:  # fmt: skip
    """Raise this rank's ``error``, or an :class:`FsdpError` naming the ranks that failed
    (:func:`~hipress.codec.outcome.agree_outcome`); with ``local`` (``no_dist``), this rank's
    only."""
    if local:
        if error is not None:
            raise error
        return
    state = ("this rank's state is left as it was loaded, but the ranks no longer agree: "
             if loaded else "nothing was loaded: ")  # fmt: skip
    agree_outcome(error, what=f"loading the checkpoint {where}", kind=FsdpError,
                  advice=f"{state}resume from an intact checkpoint on every rank", group=group)  # fmt: skip


def _where(checkpoint_id: Any, reader: Any) -> str:
    path = checkpoint_id if checkpoint_id is not None else getattr(reader, "path", None)
    return str(path) if path is not None else "(given by its storage reader)"


def _explain(exc: CheckpointException, where: str) -> str:
    """Why ``exc`` happened, with the file to blame where the files show it."""
    causes = [f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
              for e, _ in exc.failures.values()]  # fmt: skip
    for cause in causes:
        missing = _MISSING_KEY.search(cause)
        if missing:
            key = missing.group(1).rstrip(".")
            return (
                f"it has no entry {key!r} (it was saved from another model or program, or "
                "without hipress's state, or on fewer ranks); load it into the state it was "
                "saved from, or leave that entry out of what you load"
            )
    found = _damaged_file(where) if os.path.isdir(where) else None
    if found is None and not os.path.exists(where):
        found = "there is no such directory"
    reason = found or f"torch could not read it ({'; '.join(sorted(set(causes)))})"
    return f"{reason}; resume from an intact checkpoint"


def _damaged_file(root: str) -> str | None:
    """What is wrong with the files of the checkpoint directory ``root``: a missing or
    unreadable ``.metadata``, a missing or short data file, an entry that does not
    deserialise; None when nothing is found."""
    if not os.path.exists(os.path.join(root, ".metadata")):
        return ("it has no .metadata file: it is not a torch.distributed.checkpoint, or its "
                "save did not finish")  # fmt: skip
    try:
        meta = FileSystemReader(root).read_metadata()
        storage = dict(meta.storage_data)
    except Exception as exc:
        return f"its .metadata file is damaged ({type(exc).__name__}: {exc})"
    ends: dict[str, int] = defaultdict(int)
    for info in storage.values():
        ends[info.relative_path] = max(ends[info.relative_path], info.offset + info.length)
    for name, end in sorted(ends.items()):
        path = os.path.join(root, name)
        if not os.path.isfile(path):
            return f"its data file {name} is missing"
        size = os.path.getsize(path)
        if size < end:
            return (f"its data file {name} is truncated: {size} bytes where its metadata places "
                    f"data up to byte {end}")  # fmt: skip
    return _undecodable(root, storage, meta.state_dict_metadata)


def _undecodable(root: str, storage: dict[Any, Any], kinds: dict[str, Any]) -> str | None:
    """The first entry whose bytes do not deserialise (a damaged header, say)."""
    for index, info in sorted(storage.items(), key=lambda kv: (kv[1].relative_path, kv[1].offset)):
        if info.transform_descriptors:
            continue  # (a transformed entry: torch's own reader knows how to undo it)
        with open(os.path.join(root, info.relative_path), "rb") as f:
            f.seek(info.offset)
            blob = f.read(info.length)
        try:
            torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
        except Exception as exc:
            kind = "entry" if isinstance(kinds.get(index.fqn), BytesStorageMetadata) else "tensor"
            first = str(exc).splitlines()[0] if str(exc) else ""
            return (f"its data file {info.relative_path} is damaged: {kind} {index.fqn!r} at "
                    f"byte {info.offset} does not deserialise ({type(exc).__name__}: {first})")  # fmt: skip
    return None
