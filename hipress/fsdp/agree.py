"""The check that every rank registers the same configuration: :func:`agree`.

Ranks that compress with different algorithms, parameters, sizes or dtypes exchange payloads
that do not fit: one crashes, all wait out the process group's timeout, or the gradients come
out wrong with nothing said. So :func:`~hipress.fsdp.register` describes its configuration on
each rank (:func:`settings`) and the ranks exchange the descriptions (one ``all_gather_object``
over the default group) before the first compressed collective. A rank whose own setup failed
sends its error instead, so the other ranks raise too rather than wait for it
(:func:`~hipress.codec.outcome.agree_outcome`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch.distributed as dist

from hipress.codec.outcome import agree_outcome
from hipress.core.compression import CompressionAlgorithm
from hipress.fsdp.errors import FsdpConfigMismatchError, FsdpError
from hipress.fsdp.planning import UnitInfo, UnitPlan

__all__ = ["agree", "settings"]

SHOWN = 160  # characters of a setting's value shown per rank in a message


def settings(
    alg: CompressionAlgorithm,
    feedback: str,
    min_compress_numel: int,
    seed: int,
    plan: str,
    decisions: Mapping[str, UnitPlan] | None,
    units: Sequence[UnitInfo],
    replicas: int | None,
) -> dict[str, str]:
    """Everything the ranks must agree on, by the name a user knows it by, as text."""
    chosen = (
        plan if decisions is None else f"{plan} {[(k, u.compress) for k, u in decisions.items()]}"
    )
    layout = [(u.name, u.numel, u.world_size) for u in units]
    return {
        "algorithm": alg.name,
        "params": repr(sorted(dict(getattr(alg, "params", {}) or {}).items())),
        "algorithm digest": str(getattr(alg, "digest", "")),
        "feedback": feedback,
        "min_compress_numel": str(min_compress_numel),
        "seed": str(seed),
        "plan": chosen,
        "units (name, padded elements, shard ranks)": repr(layout),
        "reduce dtype (mixed precision)": repr(
            [str(u.dtype).removeprefix("torch.") for u in units]
        ),
        "replicate_group": "none" if replicas is None else f"{replicas} replicas",
    }


def agree(mine: Mapping[str, str] | None, error: BaseException | None = None) -> None:
    """Exchange this rank's :func:`settings` (or, with ``mine`` None, the ``error`` its setup
    raised) with every rank of the default group. Returns if every rank sent the same
    settings (at once, without a process group or with one rank). Raises ``error`` on its
    own rank, and on the others :class:`FsdpError` naming the ranks whose setup failed and
    their errors (:func:`~hipress.codec.outcome.agree_outcome`);
    :class:`FsdpConfigMismatchError` naming each setting that differs and every rank's value;
    or :class:`~hipress.codec.errors.CommError` if the exchange itself failed. A collective:
    every rank must call it, once per registration."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        if mine is None and error is not None:
            raise error
        return
    every = agree_outcome(
        error if mine is None else None,
        what="hipress.fsdp.register",
        advice="no rank can compress: fix that and register on every rank",
        kind=FsdpError,
        payload=None if mine is None else dict(mine),
    )
    differ = [k for k in every[0] if any(got.get(k) != every[0][k] for got in every)]
    if not differ:
        return
    lines = []
    for key in differ:
        lines.append(f"  {key}:")
        lines.extend(f"    rank {r}: {str(got.get(key))[:SHOWN]}" for r, got in enumerate(every))
    raise FsdpConfigMismatchError(
        f"hipress.fsdp ranks disagree on {', '.join(differ)}; call register with the same "
        "algorithm, params, feedback, min_compress_numel, seed and plan, on the same "
        "fully_shard-ed model and mixed precision, on every rank:\n" + "\n".join(lines)
    )
