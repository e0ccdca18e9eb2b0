"""hipress over FSDP2 (:mod:`hipress.fsdp`): real 2- and 4-process gloo runs of ``fully_shard``
models with the compressed reduce-scatter, against plain FSDP2 and the reference model."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from dist_utils import run_workers
from fsdp_workers import (
    collective,
    collective_input,
    exact_configs,
    exact_vs_plain,
    first_step_compiles,
    nonfinite_grads,
    resume,
    train_loss,
)
from torch import nn

import hipress.fsdp
from hipress.compll import load
from hipress.core.torchcompat import make_premul_sum
from hipress.fsdp import FsdpError
from hipress.fsdp.collective import divisor
from hipress.fsdp.reference import ReferenceReduceScatter

PRELOAD = ("torch", "torch.distributed", "torch.distributed.fsdp", "hipress.fsdp", "fsdp_workers")


def test_fp16_on_exact_values_equals_plain_fsdp2() -> None:
    # fp16 is lossless on these gradients: the parameters after three steps are plain FSDP2's,
    # with and without resharding, accumulation, mixed precision and a divide factor
    names = [n for n in exact_configs() if n != "hsdp"]
    for rank_out in run_workers(exact_vs_plain, 2, names, preload=PRELOAD):
        for name in names:
            plain, ours = rank_out[name]
            for k in plain:
                assert torch.equal(plain[k], ours[k]), (name, k)


def test_fp16_exact_on_four_ranks_and_across_replicas() -> None:
    # "hsdp": FSDP2's HSDP (2 replicas x 2 shards) against 1-D FSDP2 on the shard groups with
    # hipress's reduce-scatter and its compressed all-reduce hook across the replicas
    names = ["fp32", "hsdp"]
    for rank_out in run_workers(exact_vs_plain, 4, names, preload=PRELOAD):
        for name in names:
            plain, ours = rank_out[name]
            assert all(torch.equal(plain[k], ours[k]) for k in plain), name


CASES = [
    {"alg": "onebit", "feedback": "fp32", "op": dist.ReduceOp.AVG},
    {"alg": "onebit", "feedback": "bf16", "op": dist.ReduceOp.SUM},
    # flags as device tensors, as on CUDA (masked fills and resets, no read back)
    {"alg": "onebit", "feedback": "fp32", "op": dist.ReduceOp.AVG, "device_flags": True},
    {"alg": "signsgd", "feedback": "int8", "op": dist.ReduceOp.AVG, "device_flags": True},
    {"alg": "terngrad", "feedback": "none", "op": dist.ReduceOp.AVG, "seed": 3},
    {"alg": "signsgd", "feedback": "fp32", "op": make_premul_sum(0.25)},
    {"alg": "signsgd", "feedback": "bf16", "op": dist.ReduceOp.AVG},
    {"alg": "signsgd", "feedback": "bf16", "op": dist.ReduceOp.AVG, "dtype": torch.bfloat16},
    {"alg": "signsgd", "feedback": "int8", "op": dist.ReduceOp.SUM, "numel": 4 * 512},
    {"alg": "topk", "params": {"ratio": 0.1}, "feedback": "fp32", "op": dist.ReduceOp.AVG},
    {"alg": "fp16", "feedback": "none", "op": dist.ReduceOp.AVG, "dtype": torch.bfloat16},
]


def test_collective_equals_reference_model_on_four_ranks() -> None:
    # 4 ranks, 4 steps, a NaN in rank 1's row 2 at step 1 and an Inf in rank 3's row 0 at
    # step 2: each output is the reference's bit for bit (NaN where it is NaN)
    n = 4
    cases = []
    for c in CASES:
        numel = c.get("numel", 4 * 96)
        poison = [(1, 1, 2 * numel // 4 + 5, math.nan), (3, 2, 7, math.inf)]
        cases.append({**c, "numel": numel, "steps": 4, "poison": poison})
    got = run_workers(collective, n, cases, preload=PRELOAD)
    for i, case in enumerate(cases):
        alg = load(case["alg"], **case.get("params", {}))
        ref = ReferenceReduceScatter("unit", alg, case["feedback"], case["numel"], n,
                                     seed=case.get("seed", 0))  # fmt: skip
        d, _ = divisor(case["op"], n)
        for s in range(case["steps"]):
            want = ref.step([collective_input(case, r, s) for r in range(n)], d)
            for r in range(n):
                out = got[r][i][s]
                assert out.dtype == case.get("dtype", torch.float32)
                expect = want[r].to(out.dtype)
                assert torch.equal(out.isnan(), expect.isnan()), (case["alg"], s, r)
                assert torch.equal(out.nan_to_num(), expect.nan_to_num()), (case["alg"], s, r)
            poisoned = {1: 2, 2: 0}.get(s)
            for r in range(n):
                assert bool(got[r][i][s].isnan().all()) == (r == poisoned), (case["alg"], s, r)


def test_lossy_algorithms_train_close_to_plain_fsdp2() -> None:
    runs = [
        ("plain", {}),
        ("onebit", {"algorithm": "onebit"}),
        ("onebit-bf16", {"algorithm": "onebit", "feedback": "bf16"}),
        ("terngrad", {"algorithm": "terngrad", "feedback": "none"}),
        ("signsgd-int8", {"algorithm": "signsgd", "feedback": "int8"}),
    ]
    results = run_workers(train_loss, 2, runs, preload=PRELOAD)
    first, plain = results[0]["plain"]
    assert plain < 0.3 * first
    for name, _ in runs[1:]:
        for r in results:
            f, last = r[name]
            assert f == first
            assert last < plain * 1.5 + 0.02 * first, (name, last, plain)


def test_nan_and_inf_stay_nonfinite() -> None:
    cases = [("onebit", {}), ("topk", {"params": {"ratio": 0.1}}), ("terngrad", {})]
    for per_case in run_workers(nonfinite_grads, 2, cases, preload=PRELOAD):
        for (alg, _), steps in zip(cases, per_case, strict=True):
            for s, (plain, ours) in enumerate(steps):
                for p, o in zip(plain, ours, strict=True):
                    # wherever plain FSDP2's gradient is non-finite, ours is too
                    assert not bool((~p.isfinite() & o.isfinite()).any()), (alg, s)
                bad = [not bool(o.isfinite().all()) for o in ours]
                # non-finite at steps 1 and 2 only: the states were reset, step 3 is clean
                assert any(bad) == (s in (1, 2)), (alg, s)


def test_checkpoint_and_resume_are_step_for_step_identical() -> None:
    cases = [("onebit", "bf16"), ("signsgd", "int8"), ("terngrad", "none")]
    for per_case in run_workers(resume, 2, cases, preload=PRELOAD):
        for (alg, fb), r in zip(cases, per_case, strict=True):
            assert r["roundtrip"], alg
            for a, b in zip(r["first"], r["again"], strict=True):
                assert all(torch.equal(a[k], b[k]) for k in a), (alg, fb)
            assert "world_size" in r["errors"][0]
            assert "already" in r["errors"][1]
            # error feedback per rank: bytes per element of the unsharded units
            per_element = r["memory"]["feedback"] / r["numel"]
            assert {"bf16": 2.0, "none": 0.0}.get(fb, per_element) == per_element, alg
            # int8: a byte per element and a float32 scale per block of 256, per chunk
            blocks = sum(-(-n // 256) for n in r["chunks"])
            assert fb != "int8" or r["memory"]["feedback"] == 260 * blocks
            assert r["stats"]["compressed_calls"] > 0


def test_user_errors_are_typed_and_clear() -> None:
    with pytest.raises(FsdpError, match="no fully_shard"):
        hipress.fsdp.register(nn.Linear(4, 4), "onebit")
    with pytest.raises(FsdpError, match="nosuch"):
        hipress.fsdp.register(nn.Linear(4, 4), "nosuch")
    with pytest.raises(FsdpError, match=r"nn\.Module"):
        hipress.fsdp.register("model", "onebit")  # type: ignore[arg-type]
    with pytest.raises(FsdpError, match="feedback must be one of"):
        hipress.fsdp.register(nn.Linear(4, 4), "onebit", feedback="fp8")
    with pytest.raises(FsdpError, match="keeps its own error feedback"):
        hipress.fsdp.register(nn.Linear(4, 4), "onebit", feedback="none")
    for bad in ("abc", None, 1.5):
        with pytest.raises(FsdpError, match=r"min_compress_numel must be an integer"):
            hipress.fsdp.register(nn.Linear(4, 4), "onebit", min_compress_numel=bad)  # type: ignore[arg-type]
    with pytest.raises(FsdpError, match=r"seed must be an integer, got '1'"):
        hipress.fsdp.register(nn.Linear(4, 4), "onebit", seed="1")  # type: ignore[arg-type]
    with pytest.raises(
        FsdpError, match=r"replicate_group must be a torch.distributed ProcessGroup"
    ):
        hipress.fsdp.register(nn.Linear(4, 4), "onebit", replicate_group=[0, 1])  # type: ignore[arg-type]
    with pytest.raises(FsdpError, match="MAX"):
        divisor(dist.ReduceOp.MAX, 2)
    with pytest.raises(FsdpError, match="do not split"):
        hipress.fsdp.CompressedReduceScatter(
            "u", load("fp16"), "none", 7, 2, 0, torch.device("cpu")
        )


def test_bench_configurations_and_table() -> None:
    from hipress.bench.fsdp import FsdpOptions, configs_for, fsdp_markdown

    names = [c.name for c in configs_for(FsdpOptions(variants=("onebit:bf16", "terngrad")))]
    assert names == [
        "fsdp-fp32",
        "fsdp-bf16-reduce",
        "hipress-onebit-bf16",
        "hipress-terngrad-auto",
    ]
    with pytest.raises(ValueError, match="unknown model"):
        FsdpOptions(model="nosuch")
    mem = {"params_shard": 1 << 20, "feedback": 2 << 20, "state": 2 << 20, "peak_rss": 9 << 20}
    row = {"config": "hipress-onebit-bf16", "samples_per_s": 2.0, "step_ms": 500.0,
           "wire_bytes_per_step": 3e6, "final_loss": 1.5, "memory_per_rank": mem,
           "speedup": {"fsdp-fp32": 2.0, "fsdp-bf16-reduce": 1.5}}  # fmt: skip
    results = {"meta": {"workers": 4}, "cells": [{"model": "m", "network": {"label": "x"},
                                                  "rows": [row, {"config": "c", "error": "boom"}]}]}  # fmt: skip
    md = fsdp_markdown(results)
    assert (
        "| hipress-onebit-bf16 | 2.0 | 500 | 2.00x | 1.50x | 3.0 | 1.0 | 2.0 | 2.0 | 9 | 1.500 |"
        in md
    )
    assert "failed: boom" in md


def test_register_builds_the_kernels_and_the_first_step_compiles_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    for built, added in run_workers(first_step_compiles, 2, str(tmp_path), preload=PRELOAD):
        assert built > 0 and added == 0
