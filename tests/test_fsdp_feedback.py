"""Error feedback over FSDP2 (:mod:`hipress.fsdp.feedback`): the gradient a rank has not sent
yet is kept, in every feedback option the algorithm accepts, in real 2-process gloo runs of the
compressed reduce-scatter; and ``"bf16"`` is refused where bfloat16 would lose it."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.distributed as dist
from dist_utils import run_workers

from hipress.compll import load
from hipress.fsdp import CompressedReduceScatter, FsdpError
from hipress.fsdp.feedback import resolve_feedback
from hipress.fsdp.thresholds import threshold_compare

PRELOAD = ("torch", "torch.distributed", "hipress.fsdp")
NUMEL, STEPS, EVERY = 2 * 4096, 150, 50
OWN = [("topk", {"ratio": 0.01}), ("graddrop", {}), ("dgc", {"s_percent": 0.01, "momentum": 0.0}),
       ("onebit", {}), ("efsignsgd", {}), ("tbq", {"threshold": 1.0})]  # fmt: skip
THRESHOLDED = {"topk", "graddrop", "dgc"}


def untransmitted(rank: int, world_size: int, cases: list[tuple[str, dict[str, Any], str]]
                  ) -> list[list[float] | str]:  # fmt: skip
    """Per case (algorithm, parameters, feedback): the squared norm of this rank's shard of
    the gradient summed over all ranks and steps less the reduce-scatter's outputs (what is
    still held back), every ``EVERY`` steps; or the FsdpError's message."""
    out: list[list[float] | str] = []
    rows = NUMEL // world_size
    for name, params, feedback in cases:
        try:
            rs = CompressedReduceScatter("unit", load(name, **params), feedback, NUMEL,
                                         world_size, rank, torch.device("cpu"))  # fmt: skip
        except FsdpError as exc:
            out.append(str(exc))
            continue
        held = torch.zeros(rows, dtype=torch.float64)
        series = []
        for s in range(STEPS):
            inputs = [torch.randn(NUMEL, generator=torch.Generator().manual_seed(7919 * s + r))
                      for r in range(world_size)]  # fmt: skip
            got = torch.empty(rows)
            rs(got, inputs[rank], dist.group.WORLD, dist.ReduceOp.SUM)
            held += sum(x.view(world_size, rows)[rank].double() for x in inputs) - got.double()
            if (s + 1) % EVERY == 0:
                series.append(float(held.square().sum()))
        out.append(series)
    return out


def test_bf16_keeps_the_untransmitted_gradient_or_is_refused() -> None:
    # fp32 state keeps what was not sent: it stays level. bf16 must keep it as well (within
    # rounding), or be refused with a message that says to use fp32
    cases = [(n, p, fb) for n, p in OWN for fb in ("fp32", "bf16")]
    results = run_workers(untransmitted, 2, cases, preload=PRELOAD, timeout=240, pg_timeout=60)
    for i, (name, _, fb) in enumerate(cases):
        got = [r[i] for r in results]
        if isinstance(got[0], str):
            assert fb == "bf16" and name in THRESHOLDED, (name, fb, got[0])
            assert "feedback='fp32'" in got[0] and name in got[0]
            continue
        norm = [math.sqrt(sum(r[k] for r in got)) / math.sqrt(NUMEL) for k in range(len(got[0]))]
        if fb == "fp32":
            fp32 = norm
            assert norm[-1] < 1.1 * norm[0], (name, norm)
        else:
            assert norm[-1] < 1.02 * fp32[-1] and norm[-1] < 1.1 * norm[0], (name, norm, fp32)
            assert name not in THRESHOLDED, name


def test_the_refusal_names_the_comparison_and_the_way_out() -> None:
    found = {n: threshold_compare(load(n, **p)) for n, p in OWN}
    assert found == {"topk": ("comp", "pmin"), "graddrop": ("comp", "pthr"),
                     "dgc": ("comp", "pthr"), "onebit": None, "efsignsgd": None, "tbq": None}  # fmt: skip
    with pytest.raises(FsdpError, match=r"topk.*`comp`.*`pmin`.*feedback='fp32'"):
        resolve_feedback(load("topk"), "bf16")
    assert resolve_feedback(load("topk"), "fp32") == "fp32"
    assert resolve_feedback(load("onebit"), "bf16") == "bf16"
    assert threshold_compare(object()) is None  # not a CompLL algorithm: nothing to find


def test_the_reference_model_refuses_what_the_collective_refuses() -> None:
    from hipress.fsdp.reference import ReferenceReduceScatter

    with pytest.raises(FsdpError, match="feedback='fp32'"):
        ReferenceReduceScatter("u", load("dgc"), "bf16", 64, 2)
    assert ReferenceReduceScatter("u", load("onebit"), "bf16", 64, 2).feedback == "bf16"
