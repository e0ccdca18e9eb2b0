"""Checkpoints of a CaSync :class:`~hipress.casync.runtime.Runtime`: this rank's state dict
(with the plan it was trained with, sealed with a digest), finding this rank's entry in a
gathered one (resharded from another world size: :mod:`hipress.casync.reshard`), restoring
either, all or nothing, and reading a checkpoint file with a typed error (:func:`read`).

The state dict formats are in :mod:`hipress.codec.checkpoint`;
:class:`~hipress.casync.state.CaSyncState`'s ``state_dict``, ``gathered_state_dict`` and
``load_state_dict`` are these functions over its runtime.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hipress.casync.config import FORMAT
from hipress.casync.reshard import reshard
from hipress.casync.runtime import Runtime
from hipress.codec.checkpoint import (
    check_entry,
    check_rank,
    gathered,
    is_gathered,
    load_states,
    own_entry,
    save_states,
)
from hipress.codec.errors import CaSyncError
from hipress.codec.logs import RANK_FILTER
from hipress.core.plan import Plan, PlanError, Strategy

logger = logging.getLogger(__name__)
logger.addFilter(RANK_FILTER)

__all__ = ["RANK_FILE", "gather", "load", "own", "plan_of", "plan_to_adopt", "read", "save",
           "write_file"]  # fmt: skip


def save(rt: Runtime, rank: int, world_size: int) -> dict[str, Any]:
    """This rank's state dict: the states of ``rt`` (CPU copies), its step count and the plan
    they were trained with."""
    engine = rt.engine
    if engine.unused is not None and not engine.open:
        engine.unused.settle()
    extra = {"step": engine.step, "plan": rt.base_plan.to_dict()}
    return save_states(FORMAT, rank, world_size, rt.config, rt.parts(), extra)


# a rank's own state file in a framework's checkpoint folder (Accelerate, the HF Trainer)
RANK_FILE = "hipress_casync_rank{rank}.pt"


def write_file(sd: Any, path: str | Path) -> None:
    """``torch.save`` ``sd`` to ``path`` whole or not at all (a temporary file, renamed)."""
    path = Path(path)
    tmp = path.with_suffix(".tmp")
    torch.save(sd, tmp)
    tmp.replace(path)


def read(path: str | Path) -> Any:
    """``torch.load`` of the checkpoint file ``path`` (to the CPU, tensors and plain values
    only). Raises :class:`CaSyncError` naming the file if it is missing or cannot be read
    (truncated, damaged, not written by ``torch.save``); its CaSync state is checked by
    ``load_state_dict``."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CaSyncError(f"{path}: no such checkpoint file") from None
    except Exception as exc:  # any unpickling or zip error: the file is damaged
        raise CaSyncError(
            f"{path}: not a readable checkpoint (truncated, damaged or not written by "
            f"torch.save): {type(exc).__name__}: {exc}"
        ) from None


def gather(
    rt: Runtime, rank: int, world_size: int, group: Any, failed: BaseException | None
) -> dict[str, Any]:
    """Every rank's :func:`save` in one, on every rank (a collective over ``group``). After a
    failed collective (``failed``), or if this gather fails, this rank's own only (a peer is
    gone: a collective would fail or wait out the group's timeout), with ``missing``, the
    other ranks, and a warning saying so."""
    mine = save(rt, rank, world_size)
    if failed is None:
        out: list[Any] = [None] * world_size
        try:
            dist.all_gather_object(out, mine, group=group)
            return gathered(out, world_size)
        except Exception as exc:  # gloo/NCCL error: a peer exited or stalled
            failed = exc
    missing = [r for r in range(world_size) if r != rank]
    logger.warning(
        "casync: the gathered state dict holds rank %d's compression state only, ranks %s are "
        "missing (their error feedback starts from zero when resumed): a collective failed: %s",
        rank, missing, failed,
    )  # fmt: skip
    sd = gathered([mine if r == rank else None for r in range(world_size)], world_size)
    sd["missing"] = missing
    return sd


def plan_of(sd: Mapping[str, Any]) -> Plan:
    """The plan a state dict (one rank's or gathered) was trained with. Raises
    :class:`CaSyncError` if it holds none or a damaged one."""
    ranks = sd.get("ranks") if is_gathered(sd) else [sd]
    one = ranks[0] if isinstance(ranks, list | tuple) and ranks else None
    raw = one.get("plan") if isinstance(one, Mapping) else None
    if raw is None:
        raise CaSyncError(
            "the state dict holds no plan (it was saved by an earlier hipress): pass the "
            "plan file it was trained with as plan="
        )
    try:
        return Plan.from_dict(raw)
    except PlanError as exc:
        raise CaSyncError(f"damaged CaSync state dict: its `plan`: {exc}") from None


def own(sd: Any, rank: int, world_size: int) -> tuple[Any, int, bool]:
    """This rank's state dict in ``sd`` (its entry, if gathered), the step it holds, and
    whether this rank is among a gathered ``sd``'s ``missing`` ranks: then another rank's
    entry stands in, for its plan, step and configuration only. A complete gathered ``sd`` of
    another world size gives an entry that :func:`load` reshards. Every entry's digest is
    checked (:mod:`hipress.codec.integrity`). Raises :class:`CaSyncError` for a damaged or
    foreign entry, one rank's state dict of another rank or world size, or a step that is not
    an integer >= 0."""
    stand_in = False
    if is_gathered(sd) and sd.get("world_size") != world_size and _complete(sd):
        return _reshard_entry(sd, rank, world_size)
    if is_gathered(sd):
        entry = own_entry(sd, rank, world_size, CaSyncError)
        missing = sd.get("missing")
        if entry is None and isinstance(missing, list | tuple) and rank in missing:
            present = [e for e in sd["ranks"] if e is not None]
            if not present:
                raise CaSyncError(f"rank {rank}: damaged gathered state dict: no rank's entry")
            entry, stand_in = present[0], True
        for r, e in enumerate(sd["ranks"]):  # every rank refuses a damaged file alike
            if e is not None and e is not entry:
                check_entry(e, FORMAT, f"rank {rank}: the checkpoint's entry {r}", CaSyncError)
        sd = entry
        where = f"rank {rank}" + (" (standing in: another rank's entry)" if stand_in else "")
        check_entry(sd, FORMAT, where, CaSyncError)
    elif isinstance(sd, Mapping) and sd.get("format") == FORMAT:
        check_entry(sd, FORMAT, f"rank {rank}", CaSyncError)
        if "rank" in sd and "world_size" in sd:
            check_rank(sd, rank, world_size, CaSyncError)
    step = sd.get("step", 0) if isinstance(sd, Mapping) else 0
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CaSyncError(f"rank {rank}: state dict `step` must be an integer >= 0, got {step!r}")
    return sd, step, stand_in


def plan_to_adopt(sd: Any, rank: int) -> Plan | None:
    """For a state with no plan yet: the plan ``sd`` (this rank's) brings, if any. Refuses a
    state dict of another kind now, before any planning (which is collective)."""
    if not isinstance(sd, Mapping) or sd.get("format") != FORMAT:
        got = sd.get("format") if isinstance(sd, Mapping) else type(sd).__name__
        raise CaSyncError(f"rank {rank}: not a CaSync state dict (format {got!r})")
    return plan_of(sd) if "plan" in sd else None


def load(rt: Runtime, sd: Any, step: int, *, rank: int, world_size: int, carry_over: bool,
         check_plan: bool = True, stand_in: bool = False) -> None:  # fmt: skip
    """Restore ``rt`` from ``sd`` (this rank's state dict, from :func:`own`) in place, all or
    nothing, and set its step count to ``step``. A state dict of another algorithm is refused,
    saying which; one of another plan too (``check_plan``), saying how to resume, unless
    ``carry_over``: then the states of parameters planned alike in both plans are restored and
    the others kept. ``stand_in``: ``sd`` is another rank's (this rank's is missing, see
    :func:`own`): its configuration is checked, the states are kept. An entry :func:`own` made
    from another world size's checkpoint is resharded (:mod:`hipress.casync.reshard`)."""
    if stand_in:
        _check_stand_in(rt, sd, rank)
        rt.engine.resume_at(step)
        return
    ours = isinstance(sd, Mapping) and sd.get("format") == FORMAT
    if ours and "plan" in sd:
        _check_algorithm(rt, plan_of(sd), rank)
    saved = plan_of(sd) if check_plan and ours and "plan" in sd else None
    moved = ours and "reshard" in sd
    if saved is not None and saved.digest() != rt.base_plan.digest():
        if not carry_over or moved:
            raise CaSyncError(
                f"rank {rank}: the state dict was saved with a different plan "
                f"({saved.digest()}; this state runs {rt.base_plan.digest()}). To resume "
                "it, make the state with plan=CaSyncState.plan_of(checkpoint) (or "
                "plan='auto', which takes the saved plan); to keep this plan, do not load the "
                "hook's state (error feedback then starts afresh)"
                + ("" if moved else ", or load it with carry_over=True (the states of "
                   "parameters planned alike carry over)")
            )
        sd = _carried(rt, sd, saved, rank)
    if moved:
        if any(e.strategy is Strategy.ROUNDS for e in rt.base_plan.entries):
            raise CaSyncError(
                f"rank {rank}: cannot reshard the states of {rt.base_plan.algorithm}'s rounds "
                f"(the checkpoint was saved at another world size, this run has {world_size}): "
                "resume at the world size it was saved at, or do not load the hook's state "
                "(error feedback then starts afresh)"
            )
        sd = _resharded(rt, sd, rank, world_size)
    load_states(
        sd, fmt=FORMAT, what="CaSync", rank=rank, world_size=world_size, config=rt.config,
        parts=rt.parts(), error=CaSyncError, verified=True,
    )  # fmt: skip
    if rt.engine.unused is not None:
        rt.engine.unused.forget()
    rt.engine.resume_at(step)  # where warm-up, the schedule and the statistics stand


def _check_algorithm(rt: Runtime, saved: Plan, rank: int) -> None:
    """Refuse a state dict saved with another algorithm or parameters, naming both."""
    mine = rt.base_plan
    differ = sorted(k for k in saved.params if k in mine.params
                    and saved.params[k] != mine.params[k])  # fmt: skip
    if saved.algorithm == mine.algorithm and not differ:
        return
    what = (
        "another algorithm" if saved.algorithm != mine.algorithm
        else f"other parameters ({', '.join(differ)})"
    )  # fmt: skip
    raise CaSyncError(
        f"rank {rank}: the state dict was saved with {what}: {saved.algorithm} "
        f"{dict(saved.params)}, this state runs {mine.algorithm} {dict(mine.params)}; its "
        f"compression states do not fit. To resume it, register with "
        f"algorithm={saved.algorithm!r}, params={dict(saved.params)}; to change algorithms, "
        "do not load the hook's state (error feedback then starts afresh)"
    )


def _complete(sd: Mapping[str, Any]) -> bool:
    ranks = sd.get("ranks")
    return isinstance(ranks, list | tuple) and len(ranks) == sd.get("world_size")


def _reshard_entry(sd: Mapping[str, Any], rank: int, world_size: int) -> tuple[Any, int, bool]:
    """:func:`own`'s result for a gathered ``sd`` of another world size: an entry that carries
    the saved plan laid out for ``world_size`` and every rank's verified entry."""
    entries, saved_at = list(sd["ranks"]), len(sd["ranks"])
    for r, e in enumerate(entries):
        if e is None:
            continue
        check_entry(e, FORMAT, f"rank {r}'s entry", CaSyncError)
        if (e.get("rank"), e.get("world_size")) != (r, saved_at) or "plan" not in e:
            raise CaSyncError(f"damaged gathered state dict: entry {r} is not rank {r} of "
                              f"{saved_at}'s state dict")  # fmt: skip
    present = [e for e in entries if e is not None]
    if not present:
        raise CaSyncError(f"rank {rank}: damaged gathered state dict: no rank's entry")
    saved = plan_of(present[0])
    if any(plan_of(e).digest() != saved.digest() for e in present):
        raise CaSyncError("damaged gathered state dict: its entries hold different plans")
    missing = [r for r, e in enumerate(entries) if e is None]
    logger.warning(
        "casync: the checkpoint was saved at %d ranks, this run has %d: its error feedback is "
        "resharded (the sums over ranks are kept%s)", saved_at, world_size,
        f"; ranks {missing} are missing from it and add nothing" if missing else "",
    )  # fmt: skip
    entry = {
        "format": FORMAT, "config": present[0].get("config"), "step": present[0].get("step", 0),
        "plan": dataclasses.replace(saved, world_size=world_size).to_dict(),
        "reshard": {"entries": entries, "plan": saved},
    }  # fmt: skip
    step = entry["step"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CaSyncError(f"rank {rank}: state dict `step` must be an integer >= 0, got {step!r}")
    return entry, step, False


def _resharded(rt: Runtime, sd: Mapping[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    """This rank's state dict made from the entry :func:`_reshard_entry` made."""
    config = sd.get("config")
    if not isinstance(config, Mapping):
        raise CaSyncError(f"rank {rank}: damaged CaSync state dict: `config` is not a dict")
    differ = sorted(k for k in rt.config if k != "plan" and config.get(k) != rt.config[k])
    if differ:
        raise CaSyncError(f"state dict was saved with a different {', '.join(differ)}")
    moved = sd["reshard"]
    return reshard(rt, moved["entries"], moved["plan"], rank=rank, world_size=world_size)


def _check_stand_in(rt: Runtime, sd: Any, rank: int) -> None:
    """Refuse another rank's entry standing in for this rank's unless it was saved under the
    configuration ``rt`` runs; log what this rank resumes without."""
    config = sd.get("config") if isinstance(sd, Mapping) else None
    if not isinstance(sd, Mapping) or sd.get("format") != FORMAT or not isinstance(config, Mapping):
        raise CaSyncError(f"rank {rank}: damaged gathered state dict: not a CaSync state dict")
    differ = sorted(k for k in rt.config if config.get(k) != rt.config[k])
    if differ:
        raise CaSyncError(f"state dict was saved with a different {', '.join(differ)}")
    logger.warning(
        "casync: the checkpoint holds no compression state of rank %d (it was saved without "
        "it); this rank resumes at step %s with its states as they are (zero in a new state)",
        rank, sd.get("step", 0),
    )  # fmt: skip


def _carried(rt: Runtime, sd: Mapping[str, Any], saved: Plan, rank: int) -> dict[str, Any]:
    """``sd`` made to fit ``rt``'s plan: the states of parameters planned alike in both plans
    from ``sd``, the others ``rt``'s own (checked by ``load_states``)."""
    theirs_by_name = {e.name: e for e in saved.entries}
    alike = {
        e.name
        for e in rt.base_plan.entries
        if (s := theirs_by_name.get(e.name)) is not None
        and (s.numel, s.compress, s.strategy, s.partitions)
        == (e.numel, e.compress, e.strategy, e.partitions)
    }
    out = dict(sd)
    if isinstance(sd.get("config"), Mapping):
        out["config"] = {**sd["config"], "plan": rt.config["plan"]}
    fresh = []
    for part, states in rt.parts().items():
        theirs = sd.get(part)
        if not isinstance(theirs, Mapping):
            continue  # (load_states names what is missing)
        mine = {}
        for key, state in states.items():
            if key.rpartition("#")[0] in alike:
                if key not in theirs:
                    raise CaSyncError(
                        f"rank {rank}: damaged CaSync state dict: no {part} state `{key}`"
                    )
                mine[key] = theirs[key]
            else:
                mine[key] = state.state_dict()
                fresh.append(key)
        out[part] = mine
    logger.info(
        "casync: state dict of another plan: %d states carried over, %d kept as they were "
        "(%s)", sum(len(v) for v in rt.parts().values()) - len(fresh), len(fresh),
        ", ".join(sorted({k.rpartition("#")[0] for k in fresh})) or "none",
    )  # fmt: skip
    return out
