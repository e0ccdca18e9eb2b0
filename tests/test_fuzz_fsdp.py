"""Fuzzing :func:`hipress.fsdp.register`'s arguments across ranks, in a real 2-process gloo group:
generated combinations (algorithm, params, min_compress_numel, feedback, seed, backend, plan
mappings and callables, replicate_group, values of the wrong type), the same on both ranks or
differing in one argument. Every case ends, on every rank, either accepted on both (and a
training step runs) or with an :class:`~hipress.fsdp.FsdpError` on both: never a raw
TypeError/AttributeError, never one rank accepted and the other refused, never a hang (the
process group's timeout is short and the whole run is bounded).

A short run is part of the test suite; a long one::

    HIPRESS_FUZZ_EXAMPLES=200 .venv/bin/python -m pytest -q tests/test_fuzz_fsdp.py
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch
import torch.distributed as dist
from dist_utils import run_workers
from fsdp_workers import grid_batch, grid_model, shard
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import hipress.fsdp
from hipress.fsdp import FsdpError

FUZZ = int(os.environ.get("HIPRESS_FUZZ_EXAMPLES", "0"))
CASES_PER_RUN = 10  # one 2-process group runs a list of cases, each on a fresh model
PRELOAD = ("torch", "torch.distributed", "torch.distributed.fsdp", "hipress.fsdp", "fsdp_workers")

# plans and groups that cannot be pickled travel as tokens, made into objects on each rank
CALLABLE_PLANS = ("callable:true", "callable:false", "callable:raises", "callable:returns-str")
CHOICES: dict[str, list[Any]] = {
    "algorithm": ["onebit", "topk", "fp16", "bf16", "terngrad", "signsgd", "nosuch", "none", "",
                  None, 3, b"onebit"],
    "params": [None, {}, {"ratio": 0.1}, {"ratio": "x"}, {"ratio": 2.0}, {"bitwidth": 3},
               {"bitwidth": 4}, {"nosuch": 1}, [1, 2], "abc", {1: 2}],
    "min_compress_numel": [1, 0, 50, 1 << 16, -5, "1", 1.5, None, True, math.nan, 2**70],
    "feedback": ["auto", "none", "fp32", "bf16", "int8", "zz", None, 1],
    "seed": [0, 1, -1, "x", 2**70, None],
    "backend": ["auto", "reference", "cpu", "zz", None],
    "plan": ["default", None, {"0": True}, {"0": False}, {"2": True, "0": False}, {"nosuch": True},
             {"0": "yes"}, {0: True}, 5, ["0"], "nosuch", *CALLABLE_PLANS],
    "replicate_group": [None, None, None, "world", "abc", 5],
}  # fmt: skip


def _plan(value: Any) -> Any:
    if value == "callable:true":
        return lambda name: True
    if value == "callable:false":
        return lambda name: False
    if value == "callable:returns-str":
        return lambda name: "yes"
    if value == "callable:raises":

        def boom(name: str) -> bool:
            raise KeyError(name)

        return boom
    return value


def _kwargs(case: dict[str, Any]) -> dict[str, Any]:
    kw = {k: v for k, v in case.items() if k != "replicate_group"}
    kw["plan"] = _plan(kw.get("plan", "default"))
    group = case.get("replicate_group")
    kw["replicate_group"] = dist.group.WORLD if group == "world" else group
    return kw


def register_cases(rank: int, world_size: int, cases: list[tuple[dict[str, Any], dict[str, Any]]]
                   ) -> list[tuple[str, str]]:  # fmt: skip
    """Each case's outcome on this rank: (the error's type, its message), or ("accepted", the
    gradient norm after one step)."""
    out = []
    for mine, other in cases:
        model = shard(grid_model())
        try:
            hipress.fsdp.register(model, **_kwargs(mine if rank == 0 else other))
        except Exception as exc:  # the property is about its type
            out.append((type(exc).__name__ if not isinstance(exc, FsdpError) else "FsdpError",
                        f"{type(exc).__name__}: {exc}"))  # fmt: skip
            continue
        x, t = grid_batch(rank, 0)
        (model(x) * t).sum().backward()
        norm = sum(float(p.grad.to_local().float().norm()) for p in model.parameters())
        out.append(("accepted", repr(norm)))
    return out


def _case() -> st.SearchStrategy[dict[str, Any]]:
    """A working configuration with zero to three arguments drawn from :data:`CHOICES`."""
    keys = st.lists(st.sampled_from(sorted(CHOICES)), max_size=3, unique=True)
    return keys.flatmap(
        lambda ks: st.fixed_dictionaries(
            {"algorithm": st.just("onebit"), "min_compress_numel": st.just(1),
             **{k: st.sampled_from(CHOICES[k]) for k in ks}}
        )
    )  # fmt: skip


@st.composite
def _pair(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    """Rank 0's arguments and rank 1's: the same, or one argument different."""
    mine = draw(_case())
    other = dict(mine)
    if draw(st.booleans()):
        key = draw(st.sampled_from(sorted(CHOICES)))
        other[key] = draw(st.sampled_from(CHOICES[key]))
    return mine, other


@settings(max_examples=max(1, FUZZ // CASES_PER_RUN) if FUZZ else 1, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
@given(cases=st.lists(_pair(), min_size=CASES_PER_RUN, max_size=CASES_PER_RUN))
def test_register_ends_alike_on_every_rank_with_a_typed_error_or_accepted(
    cases: list[tuple[dict[str, Any], dict[str, Any]]],
) -> None:
    torch.manual_seed(0)
    results = run_workers(register_cases, 2, cases, preload=PRELOAD, timeout=240, pg_timeout=20)
    for i, (mine, other) in enumerate(cases):
        (k0, m0), (k1, m1) = results[0][i], results[1][i]
        note(f"case {i}: rank 0 {mine!r} -> {k0} {m0}; rank 1 {other!r} -> {k1} {m1}")
        assert k0 in ("accepted", "FsdpError") and k1 in ("accepted", "FsdpError"), (i, m0, m1)
        assert k0 == k1, (i, mine, other, m0, m1)  # both accepted, or both refused
        if k0 == "accepted":
            assert math.isfinite(float(m0)) and math.isfinite(float(m1))
