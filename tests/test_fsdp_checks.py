"""What :func:`hipress.fsdp.register` checks across ranks before the first compressed
collective, in real 2-process gloo runs: every rank registers the same configuration, and a
``replicate_group`` holds the replicas of this rank's shards."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from dist_utils import run_workers
from fsdp_workers import grid_batch, grid_model, shard
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy

import hipress.fsdp
from hipress.codec.errors import CaSyncError, ConfigMismatchError
from hipress.fsdp import FsdpError
from hipress.fsdp.errors import FsdpConfigMismatchError

PRELOAD = ("torch", "torch.distributed", "torch.distributed.fsdp", "hipress.fsdp", "fsdp_workers")


def replicate_with_the_shard_group(rank: int, world_size: int) -> str:
    """register's error for replicate_group = the group the model is sharded on."""
    try:
        hipress.fsdp.register(shard(grid_model()), "fp16", min_compress_numel=1,
                              replicate_group=dist.group.WORLD)  # fmt: skip
    except FsdpError as exc:
        return str(exc)
    return "accepted"


def test_a_replicate_group_that_is_the_shard_group_is_refused() -> None:
    for msg in run_workers(replicate_with_the_shard_group, 2, preload=PRELOAD, timeout=120):
        assert "shares ranks [0, 1] with" in msg, msg
        assert "mesh['replicate'].get_group()" in msg


BF16_REDUCE = {"reduce_dtype": torch.bfloat16}
# (what differs, rank 0's register kwargs, rank 1's, rank 1's MixedPrecisionPolicy kwargs)
MISMATCHES: list[tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]] = [
    ("algorithm", {"algorithm": "onebit"}, {"algorithm": "topk"}, {}),
    ("algorithm", {"algorithm": "fp16"}, {"algorithm": "bf16"}, {}),
    ("params", {"algorithm": "topk", "params": {"ratio": 0.1}},
     {"algorithm": "topk", "params": {"ratio": 0.5}}, {}),
    ("min_compress_numel", {"min_compress_numel": 1}, {"min_compress_numel": 50}, {}),
    ("feedback", {"feedback": "fp32"}, {"feedback": "bf16"}, {}),
    ("seed", {"algorithm": "terngrad", "seed": 1}, {"algorithm": "terngrad", "seed": 2}, {}),
    ("plan", {"plan": {"0": True}}, {"plan": {"0": False}}, {}),
    ("reduce dtype", {"algorithm": "fp16"}, {"algorithm": "fp16"}, BF16_REDUCE),
]  # fmt: skip


def mismatched(rank: int, world_size: int) -> list[tuple[str, str]]:
    """Per case of MISMATCHES, then rank 1 failing on its own, then the same configuration on
    both ranks: (the error's type, its message), or ("accepted", gradient norm) after a step."""
    out = []
    cases = [*MISMATCHES, ("own failure", {}, {"algorithm": "nosuch"}, {}), ("same", {}, {}, {})]
    for _, mine, other, policy in cases:
        kwargs = {"algorithm": "onebit", "min_compress_numel": 1, **(mine if rank == 0 else other)}
        mp = MixedPrecisionPolicy(**(policy if rank == 1 else {}))
        model = shard(grid_model(), mp_policy=mp)
        try:
            hipress.fsdp.register(model, **kwargs)
        except CaSyncError as exc:
            out.append((type(exc).__name__, str(exc)))
            continue
        x, t = grid_batch(rank, 0)
        (model(x) * t).sum().backward()
        out.append(
            ("accepted", str(sum(float(p.grad.to_local().norm()) for p in model.parameters())))
        )
    return out


def test_ranks_that_register_differently_all_raise_naming_the_setting() -> None:
    results = run_workers(mismatched, 2, preload=PRELOAD, timeout=180, pg_timeout=30)
    for i, (what, *_) in enumerate(MISMATCHES):
        for rank, r in enumerate(results):
            kind, msg = r[i]
            assert kind == "FsdpConfigMismatchError", (what, rank, kind, msg)
            assert f"disagree on {what}" in msg, (what, msg)
            assert "rank 0:" in msg and "rank 1:" in msg
    kind0, msg0 = results[0][-2]
    kind1, msg1 = results[1][-2]
    assert kind0 == "FsdpError" and "hipress.fsdp.register failed on rank 1;" in msg0, msg0
    assert "\n  rank 1: FsdpError: " in msg0 and "nosuch" in msg0, msg0
    assert kind1 == "FsdpError" and "nosuch" in msg1 and "failed on rank" not in msg1, msg1
    assert all(r[-1][0] == "accepted" for r in results)  # agreeing ranks still train


def test_the_mismatch_error_is_both_fsdp_and_config_mismatch() -> None:
    assert issubclass(FsdpConfigMismatchError, FsdpError)
    assert issubclass(FsdpConfigMismatchError, ConfigMismatchError)


# ---------------------------------------------------------------- checkpoints of another run


def _registered(algorithm: str, plan: dict[str, bool]) -> Any:
    torch.manual_seed(0)
    model = shard(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)))
    comp = hipress.fsdp.register(model, algorithm, min_compress_numel=1, plan=plan)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(dist.get_rank()))
    model(x).square().sum().backward()  # every compressed unit holds a residual now
    return comp


def _load(path: str, algorithm: str, plan: dict[str, bool]) -> tuple[str, str]:
    """(the error's type, its message) of loading ``path`` into a fresh registration."""
    comp = _registered(algorithm, plan)
    try:
        dcp.load({"hipress": comp}, checkpoint_id=path)
    except BaseException as exc:  # torch's CheckpointException is a BaseException
        return type(exc).__name__, str(exc)[:600]
    return "loaded", ""


BOTH = {"0": True, "2": True}
LOADS = [("onebit", {"0": True, "2": False}), ("onebit", {"0": False, "2": True}),
         ("efsignsgd", BOTH), ("onebit", BOTH)]  # fmt: skip


def save_then_load_other(rank: int, world_size: int, root: str) -> list[tuple[str, str]]:
    """Save onebit with both units compressed (world_size 2 only), then load it with each of
    LOADS; the last is the same configuration."""
    path = f"{root}/ckpt"
    if world_size == 2:
        dcp.save({"hipress": _registered("onebit", BOTH)}, checkpoint_id=path)
        return [_load(path, alg, plan) for alg, plan in LOADS]
    return [_load(path, "onebit", BOTH)]


def test_a_checkpoint_of_another_plan_or_algorithm_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    root = str(tmp_path)
    for got in run_workers(save_then_load_other, 2, root, preload=PRELOAD, timeout=120):
        (k1, m1), (k2, m2), (k3, m3), (k4, _) = got
        assert k1 == "FsdpError" and "units ['2']" in m1 and "plan={" in m1, (k1, m1)
        assert k2 == "FsdpError" and "units ['0']" in m2, (k2, m2)
        assert k3 == "FsdpError" and "algorithm is 'onebit'" in m3, (k3, m3)
        assert k4 == "loaded"
    for n in (4, 1):  # more ranks, fewer ranks: resharded (tests/test_fsdp_reshard.py)
        for ((kind, msg),) in run_workers(
            save_then_load_other, n, root, preload=PRELOAD, timeout=120
        ):
            assert kind == "loaded", (n, kind, msg)


def one_rank_registers(rank: int, world_size: int) -> str:
    """Rank 0 registers; rank 1 does not and leaves: rank 0's error type and message."""
    model = shard(grid_model())
    if rank == 1:
        return ""
    try:
        hipress.fsdp.register(model, "onebit", min_compress_numel=1)
    except CaSyncError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "accepted"


def test_a_rank_that_does_not_register_is_a_comm_error_not_a_hang() -> None:
    got = run_workers(one_rank_registers, 2, preload=PRELOAD, timeout=90, pg_timeout=10)
    assert got[0].startswith("CommError: ") and "did a rank exit" in got[0], got[0]
