"""Integrity of checkpointed compression state: a digest sealed in at save and verified at load,
and the check that the state a step would use is finite.

A sealed state dict carries ``version`` (:data:`VERSION`) and ``digest``: the SHA-256 of every
other entry, tensors by dtype, shape and bytes. A changed byte (a bit flip, a partial write, an
edit) that leaves the file readable changes the digest. State dicts saved before the digest
existed (no ``digest``) still load, with a warning that they are unverified: they were valid
checkpoints, and refusing them would strand every job saved by an earlier version.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from typing import Any

import torch

from hipress.codec.logs import RANK_FILTER

logger = logging.getLogger(__name__)
logger.addFilter(RANK_FILTER)

__all__ = ["VERSION", "check_finite", "digest", "seal", "verify"]

# version 2: sealed with ``digest``; version 1 (no ``version`` entry): unsealed
VERSION = 2
# every entry an unsealed (version 1) state dict may hold: one with others lost its digest
_UNSEALED_KEYS = frozenset(
    {"format", "rank", "world_size", "config", "worker", "server", "step", "plan"}
)


def digest(obj: Any) -> str:
    """The SHA-256 (hex) of ``obj``: nested dicts (keys sorted), lists, tensors (dtype, shape,
    bytes), numbers, strings, bytes and None. The same value gives the same digest in any
    process."""
    h = hashlib.sha256()
    _feed(h, obj)
    return h.hexdigest()


def _feed(h: Any, obj: Any) -> None:
    if isinstance(obj, Mapping):
        h.update(b"{%d" % len(obj))
        for k in sorted(obj, key=str):
            _feed(h, str(k))
            _feed(h, obj[k])
    elif isinstance(obj, list | tuple):
        h.update(b"[%d" % len(obj))
        for v in obj:
            _feed(h, v)
    elif isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous().reshape(-1)
        h.update(f"T{t.dtype}{tuple(obj.shape)}{t.numel()}".encode())
        if t.numel():
            h.update(t.view(torch.uint8).numpy().data)
    elif isinstance(obj, bytes | bytearray):
        h.update(b"B%d:" % len(obj) + bytes(obj))
    elif obj is None or isinstance(obj, bool | int | float | str):
        text = repr(obj).encode()
        h.update(f"{type(obj).__name__}{len(text)}:".encode() + text)
    else:  # (a foreign object: its repr, so that it differs from every value above)
        h.update(f"?{type(obj).__name__}:{obj!r}".encode())


def seal(sd: dict[str, Any]) -> dict[str, Any]:
    """``sd`` with ``version`` and ``digest`` set (in place; returned)."""
    sd["version"] = VERSION
    sd.pop("digest", None)
    sd["digest"] = digest(sd)
    return sd


def verify(sd: Mapping[str, Any], where: str, error: type[Exception]) -> bool:
    """Check ``sd``'s digest; ``where`` names it in messages (e.g. "rank 1"). Returns True if
    it was verified, False for an unsealed (earlier) state dict, after a warning. Raises
    ``error`` if the digest does not match or is malformed."""
    if "digest" not in sd:
        if "version" in sd or not set(sd) <= _UNSEALED_KEYS:
            odd = sorted(set(sd) - _UNSEALED_KEYS) or ["version"]
            raise error(
                f"{where}: damaged checkpoint: it has no digest, but entries an unsealed one "
                f"does not have ({', '.join(map(str, odd))}): bytes changed after it was written"
            )
        logger.warning(
            "%s: the checkpoint's compression state carries no digest (saved by an earlier "
            "hipress): it is loaded unverified; save it again to seal it", where,
        )  # fmt: skip
        return False
    saved = sd["digest"]
    if not isinstance(saved, str) or sd.get("version") != VERSION:
        raise error(
            f"{where}: damaged checkpoint: its digest or version is malformed "
            f"(version {sd.get('version')!r}, this hipress writes {VERSION})"
        )
    if digest({k: v for k, v in sd.items() if k != "digest"}) != saved:
        raise error(
            f"{where}: damaged checkpoint: its compression state does not match the digest "
            "saved with it (bytes changed after it was written: a bit flip, a partial write or "
            "an edit). Resume from an intact copy, or leave out the hook's state (error "
            "feedback then starts afresh)"
        )
    return True


def _finite(t: torch.Tensor) -> bool:
    """Whether every value of ``t`` is finite: one pass without a temporary (min and max
    propagate NaN and show an infinity)."""
    lo, hi = torch.aminmax(t.detach().reshape(-1).float() if t.dtype == torch.bfloat16 else
                           t.detach().reshape(-1))  # fmt: skip
    return bool(torch.isfinite(lo) & torch.isfinite(hi))


def check_finite(states: Mapping[str, Any], where: str, error: type[Exception]) -> None:
    """Raise ``error`` if a state in ``states`` (key -> a ``State.state_dict()``) holds a NaN or
    infinity that the next step would use. A state whose ``lost`` flag is set (its last step
    was non-finite) is exempt: the algorithm drops its contents at the next step."""
    for key, sd in states.items():
        tensors = sd.get("tensors") if isinstance(sd, Mapping) else None
        if not isinstance(tensors, Mapping):
            continue  # (the loader names the malformed entry)
        lost = tensors.get("lost")
        if isinstance(lost, torch.Tensor) and lost.dtype == torch.bool and bool(lost.any()):
            continue
        for name, t in tensors.items():
            if not isinstance(t, torch.Tensor) or not t.is_floating_point():
                continue
            if t.device.type == "meta" or t.numel() == 0 or _finite(t):
                continue
            bad = int((~torch.isfinite(t)).sum())
            if bad:
                raise error(
                    f"{where}: state `{key}` entry `{name}` holds {bad} non-finite value(s) "
                    "(NaN/Inf) that the next step would add to the gradient (the run that saved "
                    "it had diverged, or the file was altered). Resume from an earlier "
                    "checkpoint, or leave out the hook's state (error feedback then starts "
                    "afresh)"
                )
