"""A CaSync state's configuration: its options checked eagerly, the parameter schedule, the
digests every rank must agree on, and the first step's agreement check.

Every check raises :class:`~hipress.codec.errors.CaSyncError` with a message that names the
option and says what it takes; ranks that disagree raise
:class:`~hipress.codec.errors.ConfigMismatchError` on every rank, with each rank's description.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from hipress.casync.optimizers import (  # (re-exported: the optimizer checks lived here)
    ADAPTIVE_STEP_MIN,
    VARIANCE_MAX,
    adaptive_step,
    check_optimizer,
    relative_variance,
    watch_optimizers,
)
from hipress.casync.strategies.context import all_gather
from hipress.codec.algorithm import resolve_algorithm
from hipress.codec.errors import CaSyncError, CommError, ConfigMismatchError
from hipress.codec.planning import PLAN_WORDS
from hipress.core.compression import CompressionAlgorithm, compresses
from hipress.core.plan import Plan
from hipress.core.rule import DefaultRule, Selection

__all__ = [
    "ADAPTIVE_STEP_MIN",
    "FORMAT",
    "VARIANCE_MAX",
    "adaptive_step",
    "check_agreement",
    "check_optimizer",
    "check_options",
    "check_schedule",
    "check_selection",
    "check_wrapper_options",
    "config_digest",
    "describe",
    "params_at",
    "relative_variance",
    "watch_optimizers",
]

FORMAT = "hipress.casync/1"
DIGEST_BYTES = 16
NOTE_BYTES = 512

Schedule = tuple[tuple[int, dict[str, Any]], ...]


def digest16(text: str) -> bytes:
    """The first :data:`DIGEST_BYTES` of ``text``'s SHA-256."""
    return hashlib.sha256(text.encode()).digest()[:DIGEST_BYTES]


def _whole(name: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise CaSyncError(f"{name} must be an integer >= 0, got {v!r}")


def check_options(params: Any, seed: Any, rule: Any, check_finite: Any, log_every: Any,
                   warmup_steps: Any, plan: Any) -> None:  # fmt: skip
    """:class:`CaSyncState`'s arguments, each with a message that names it and says what it
    takes."""
    if params is not None and not isinstance(params, Mapping):
        raise CaSyncError(
            f"params must be a dict of the algorithm's parameters, e.g. {{'bitwidth': 2}}, got "
            f"{params!r}"
        )
    _whole("seed", seed)
    _whole("log_every", log_every)
    _whole("warmup_steps", warmup_steps)
    if not isinstance(check_finite, bool):
        raise CaSyncError(f"check_finite must be True or False, got {check_finite!r}")
    if rule is not None and not isinstance(rule, DefaultRule):
        raise CaSyncError(f"rule must be a DefaultRule or None, got {rule!r}")
    word = plan.strip().lower() if isinstance(plan, str) else None
    if word in PLAN_WORDS and plan != word:
        raise CaSyncError(f"plan={plan!r}: did you mean plan={word!r}?")
    if plan is not None and not isinstance(plan, Plan | str | Path):
        raise CaSyncError(
            "plan must be 'default' (or None: the default rule), 'auto' (SeCoPa's plan), a path "
            f"to a plan file or a Plan, got {plan!r}"
        )


def check_schedule(
    schedule: Sequence[tuple[int, Mapping[str, Any]]],
    name: str | None,
    params: Mapping[str, Any] | None,
    base: CompressionAlgorithm,
) -> Schedule:
    """Validate ``params_schedule`` eagerly: ``(step, params)`` pairs with ascending steps,
    for an algorithm given by ``name`` (``base``: as resolved with ``params``), keeping
    ``base``'s state layout at every entry. Each set of parameters ``base`` was not resolved
    with is resolved once, with the reference backend (nothing compiles)."""
    if (
        isinstance(schedule, str | bytes)
        or not isinstance(schedule, Sequence)
        or not all(
            isinstance(x, Sequence) and len(x) == 2 and isinstance(x[1], Mapping) for x in schedule
        )
    ):
        raise CaSyncError(
            f"params_schedule must be a list of (step, params) pairs, e.g. [(0, {{'s_percent': "
            f"0.25}}), (500, {{'s_percent': 0.001}})], got {schedule!r}"
        )
    out = tuple((at, dict(p)) for at, p in schedule)
    if not out:
        return out
    if name is None:
        raise CaSyncError("params_schedule needs the algorithm given by name, e.g. 'dgc'")
    steps = [at for at, _ in out]
    if any(
        isinstance(a, bool) or not isinstance(a, int) or a < 0 for a in steps
    ) or steps != sorted(set(steps)):
        raise CaSyncError(f"params_schedule steps must be ascending integers >= 0, got {steps}")
    want = _state_layout(base)
    merged = dict(params or {})
    seen = [dict(merged)]
    for at, update in out:
        merged.update(update)
        if merged in seen:
            continue
        seen.append(dict(merged))
        if _state_layout(resolve_algorithm(name, merged, "reference")) != want:
            raise CaSyncError(
                f"params_schedule step {at}: {name} with {merged} keeps a different state "
                "than with its first parameters, so the state cannot carry over"
            )
    return out


def _state_layout(alg: CompressionAlgorithm) -> list[dict[str, tuple[Any, Any]]]:
    """The shapes and dtypes of ``alg``'s state for a few tensor sizes (on the meta device)."""
    return [
        {k: (t.shape, t.dtype) for k, t in alg.init_state(n, device="meta").tensors.items()}
        for n in (1, 997, 1 << 16)
    ]


def params_at(base: Mapping[str, Any], schedule: Schedule, step: int) -> dict[str, Any]:
    """The algorithm's parameters in force at ``step``: ``base`` updated by every entry of
    ``schedule`` (a checked ``params_schedule``) at or before ``step``."""
    params = dict(base)
    for at, update in schedule:
        if at <= step:
            params.update(update)
    return params


def config_digest(
    algorithm_digest: str, plan_digest: str, seed: int, check_finite: bool, warmup_steps: int,
    schedule: Schedule,
) -> dict[str, str]:  # fmt: skip
    """What every rank must agree on, as hex digests: the algorithm's, the plan's and one of
    the options (with a schedule, the algorithm is the one of the first parameters: the
    schedule is among the options)."""
    options = {
        "format": FORMAT,
        "seed": seed,
        "finite": check_finite,
        "warmup": warmup_steps,
        "schedule": [[at, dict(p)] for at, p in schedule],
    }
    return {
        "algorithm": algorithm_digest,
        "plan": plan_digest,
        "options": digest16(json.dumps(options)).hex(),
    }


def describe(
    alg: CompressionAlgorithm, plan: Plan, seed: int, check_finite: bool, warmup_steps: int
) -> str:
    """One line a user can compare between ranks: algorithm, plan digest and options."""
    what = f"{alg.name} {dict(alg.params)}" if compresses(alg) else "no compression"
    compressed = sum(e.compress for e in plan.entries)
    return (
        f"{what}; plan {plan.digest()} ({compressed}/{len(plan.entries)} "
        f"compressed); seed {seed}; check_finite {check_finite}; warmup "
        f"{warmup_steps}"
    )


def check_agreement(
    mine: Mapping[str, str], note: str, world_size: int, group: Any, device: torch.device
) -> None:
    """Exchange the config digests ``mine`` (one small all-gather over ``group``, on
    ``device``: the buckets', which the group's backend serves, e.g. CUDA for NCCL); on any
    difference, exchange each rank's ``note`` (:func:`describe`) and raise
    :class:`ConfigMismatchError` on every rank. A collective: every rank must call it. A
    failed collective (a peer exited or stalled past the group's timeout) raises
    :class:`CommError`."""
    try:
        _exchange(mine, note, world_size, group, device)
    except CaSyncError:
        raise
    except Exception as exc:  # gloo/NCCL error: a peer died or timed out
        raise CommError(
            "CaSync: the first step's configuration check failed (a peer may have exited or "
            f"stalled past the process group's timeout; see the other ranks' logs): {exc}"
        ) from exc


def _exchange(
    mine: Mapping[str, str], note: str, world_size: int, group: Any, device: torch.device
) -> None:
    keys = sorted(mine)
    local = torch.frombuffer(
        bytearray(b"".join(digest16(mine[k]) for k in keys)), dtype=torch.uint8
    ).to(device)
    gathered = torch.empty(world_size * local.numel(), dtype=torch.uint8, device=device)
    all_gather(gathered, local, group=group)
    gathered = gathered.cpu()  # (once per training)
    rows = gathered.view(world_size, len(keys), DIGEST_BYTES)
    differ = [k for i, k in enumerate(keys) if not bool((rows[:, i] == rows[0, i]).all())]
    if not differ:
        return
    padded = note.encode()[:NOTE_BYTES].ljust(NOTE_BYTES, b"\0")
    notes = torch.empty(world_size * NOTE_BYTES, dtype=torch.uint8, device=device)
    mine_note = torch.frombuffer(bytearray(padded), dtype=torch.uint8).to(device)
    all_gather(notes, mine_note, group=group)
    notes = notes.cpu()
    lines = [
        f"  rank {r}: "
        + bytes(notes[r * NOTE_BYTES : (r + 1) * NOTE_BYTES].tolist())
        .rstrip(b"\0")
        .decode(errors="replace")
        for r in range(world_size)
    ]
    raise ConfigMismatchError(
        f"CaSync ranks disagree on {', '.join(differ)}; every rank must register the same "
        "algorithm, parameters, plan and options:\n" + "\n".join(lines)
    )


def check_selection(options: Mapping[str, Any]) -> None:
    """Check the ``include``, ``exclude`` and ``shapes`` among ``options`` (register's keyword
    arguments) before any model exists; raises :class:`CaSyncError` naming the wrong one."""
    try:
        Selection(options.get("include") or (), options.get("exclude") or (),
                  options.get("shapes", "all"))  # fmt: skip
    except ValueError as exc:
        raise CaSyncError(str(exc)) from None


def check_wrapper_options(options: Mapping[str, Any], who: str, group_of: str) -> None:
    """The checks a framework's wrapper (a Lightning or Trainer callback) makes on ``options``,
    the keyword arguments it passes to register, when it is built: no ``process_group`` (it
    synchronises over the process group of ``group_of``, the framework's), and the selection
    (:func:`check_selection`). Raises :class:`CaSyncError` naming ``who`` and the option."""
    if options.get("process_group") is not None:
        raise CaSyncError(
            f"{who} synchronises over the {group_of}'s process group: do not pass `process_group`"
        )
    check_selection(options)
