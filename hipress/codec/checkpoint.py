"""Checkpoints of per-chunk algorithm states, shared by the DDP hook and the Horovod wrapper.

A state dict holds one rank's states (they differ per rank): ``format``, ``rank``,
``world_size``, ``config`` (digests every rank agreed on), ``worker`` and ``server`` (chunk key ->
:meth:`~hipress.compll.ir.state.State.state_dict`), whatever the caller adds, then ``version``
and ``digest`` (:func:`~hipress.codec.integrity.seal`). Loading checks everything first (the
digest, the rank and configuration, that the states are finite) and restores all states or
none: a damaged, foreign or non-finite checkpoint leaves the running states as they were.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hipress.codec.integrity import check_finite, seal, verify
from hipress.compll.ir.state import State

PARTS = ("worker", "server")


def save_states(
    fmt: str, rank: int, world_size: int, config: Mapping[str, str],
    parts: Mapping[str, Mapping[str, State]], extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The sealed state dict of ``parts`` (``worker`` and ``server`` states by chunk key) and
    ``extra`` (entries the caller adds, sealed with the rest)."""
    out: dict[str, Any] = {
        "format": fmt, "rank": rank, "world_size": world_size, "config": dict(config),
    }  # fmt: skip
    for part, states in parts.items():
        out[part] = {k: s.state_dict() for k, s in states.items()}
    out.update(extra or {})
    return seal(out)


def load_states(
    sd: Any, *, fmt: str, what: str, rank: int, world_size: int, config: Mapping[str, str],
    parts: Mapping[str, Mapping[str, State]], error: type[Exception], verified: bool = False,
) -> Mapping[str, Any]:  # fmt: skip
    """Restore ``parts`` from ``sd`` in place, all or nothing; return ``sd``. Raises ``error``
    naming the rank and the entry: ``what`` (e.g. "CaSync") names the kind of state dict.
    ``verified``: the caller checked ``sd``'s digest already (:func:`check_entry`)."""
    me = f"rank {rank}"
    if not isinstance(sd, Mapping) or sd.get("format") != fmt:
        got = sd.get("format") if isinstance(sd, Mapping) else type(sd).__name__
        raise error(f"{me}: not a {what} state dict (format {got!r})")
    if not verified:
        verify(sd, me, error)
    missing = [k for k in ("rank", "world_size", "config", *parts) if k not in sd]
    if missing:
        raise error(f"{me}: damaged {what} state dict: no {', '.join(missing)}")
    check_rank(sd, rank, world_size, error)
    if not isinstance(sd["config"], Mapping):
        raise error(f"{me}: damaged {what} state dict: `config` is not a dict")
    differ = sorted(k for k in config if sd["config"].get(k) != config[k])
    if differ:
        raise error(f"state dict was saved with a different {', '.join(differ)}")
    for part, states in parts.items():
        if not isinstance(sd[part], Mapping) or set(sd[part]) != set(states):
            raise error(f"{me}: state dict {part} states do not match this plan")
        check_finite(sd[part], me, error)
    everything = [(part, k, s) for part, states in parts.items() for k, s in states.items()]
    backup = [s.state_dict() for _, _, s in everything]
    done = 0
    try:
        for part, k, s in everything:
            try:
                s.load_state_dict(sd[part][k])
            except (ValueError, TypeError, KeyError, RuntimeError) as exc:
                raise error(f"{me}: state `{k}`: {exc}") from None
            done += 1
    except BaseException:
        for (_, _, s), saved in zip(everything[:done], backup[:done], strict=True):
            s.load_state_dict(saved)
        raise
    return sd


def check_rank(sd: Mapping[str, Any], rank: int, world_size: int, error: type[Exception]) -> None:
    """Refuse one rank's state dict ``sd`` unless it is rank ``rank``'s of ``world_size``; for
    another world size, say how to reshard."""
    if (sd["rank"], sd["world_size"]) != (rank, world_size):
        raise error(
            f"state dict is rank {sd['rank']} of {sd['world_size']}, this is rank {rank} of "
            f"{world_size}: load each rank's own state dict"
            + ("" if sd["world_size"] == world_size else
               "; to resume at another world size, pass every rank's state dict together, "
               "as hipress.codec.checkpoint.gathered([sd_0, sd_1, ...], "
               f"{sd['world_size']}) (error feedback is then resharded)")
        )


def check_entry(sd: Any, fmt: str, where: str, error: type[Exception]) -> None:
    """Refuse ``sd`` (one rank's state dict) unless it is of format ``fmt`` and matches its
    digest (one saved before digests: a warning); ``where`` names it."""
    if not isinstance(sd, Mapping) or sd.get("format") != fmt:
        got = sd.get("format") if isinstance(sd, Mapping) else type(sd).__name__
        raise error(f"{where}: not a CaSync state dict (format {got!r})")
    verify(sd, where, error)


# ---- one checkpoint for every rank (rank 0 writes it) --------------------------------------------

# the format's name, as written in every gathered checkpoint since the first: it stays
GATHERED = "hipress.casync.gathered/1"


def gathered(sds: list[dict[str, Any]], world_size: int) -> dict[str, Any]:
    """Every rank's state dict (``sds``, in rank order) as one: ``format`` (:data:`GATHERED`),
    ``world_size`` and ``ranks``."""
    return {"format": GATHERED, "world_size": world_size, "ranks": list(sds)}


def is_gathered(sd: Any) -> bool:
    """Whether ``sd`` is the gathered form (:func:`gathered`) rather than one rank's."""
    return isinstance(sd, Mapping) and sd.get("format") == GATHERED


def own_entry(sd: Mapping[str, Any], rank: int, world_size: int, error: type[Exception]) -> Any:
    """Rank ``rank``'s state dict in the gathered ``sd``. Raises ``error`` if ``sd`` was
    gathered from another world size or is damaged."""
    ranks, saved = sd.get("ranks"), sd.get("world_size")
    if not isinstance(ranks, list | tuple) or saved != len(ranks):
        raise error(f"rank {rank}: damaged gathered state dict: `ranks` does not hold "
                    f"`world_size` ({saved!r}) entries")  # fmt: skip
    if saved != world_size:
        raise error(
            f"the state dict was gathered from {saved} ranks, this run has {world_size}: "
            f"resume with {saved} ranks, or leave out the hook's state (its error feedback "
            "then starts afresh)"
        )
    return ranks[rank]
