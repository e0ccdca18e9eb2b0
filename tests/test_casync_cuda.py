"""CaSync on CUDA tensors over NCCL (marked cuda: they run wherever a GPU exists). One process
(NCCL runs a one-rank group) on one GPU, two where two exist: every strategy, float32/16/bf16
buckets, results equal to the same run on CPU/gloo (and to the reference), no host
synchronisation in a step, plan="auto" on the GPU, Horovod on CUDA tensors where it has GPU
support. The CPU runs of the same code paths are in test_casync_hook.py and
test_codec_flags.py (flags kept on the device)."""

from __future__ import annotations

import pytest
import torch
from casync_cases import single_thread
from dist_utils import run_workers

from hipress.casync import CaSyncState
from hipress.casync.reference import ReferenceSync
from hipress.compll import load
from hipress.core.plan import Plan, Strategy, TensorPlan

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU"),
]
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
AG, PS, RING, AR = Strategy.ALLGATHER, Strategy.PS, Strategy.RING, Strategy.ALLREDUCE
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _tensors(world: int) -> list[tuple[str, int, Strategy, int]]:
    out = [("a", 10_000, PS, 2), ("b", 37, AR, 1), ("c", 70_001, AG, 3), ("d", 513, AG, 1)]
    if world >= 2:
        out.append(("e", 9_001, RING, 2))
    return out


def _grads(rank: int, step: int, world: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 * step + rank)
    return {n: torch.randint(-64, 64, (k,), generator=gen).float() / 8
            for n, k, _, _ in _tensors(world)}  # fmt: skip


def _sync(rank: int, world: int, alg: str, dtype: str, device: str, nan: bool) -> list:
    dev = torch.device(device if device == "cpu" else f"cuda:{torch.cuda.current_device()}")
    tensors = _tensors(world)
    plan = Plan(alg, {}, world, tuple(TensorPlan(n, k, s is not AR, s, p)
                                      for n, k, s, p in tensors))  # fmt: skip
    state = CaSyncState(alg, named_parameters=[(n, k) for n, k, *_ in tensors], plan=plan,
                        seed=5, device=dev, log_every=0)  # fmt: skip
    steps = []
    for step in range(3):
        g = _grads(rank, step, world)
        if nan and step == 1 and rank == 0:
            g["c"][5] = float("nan")
        buf = torch.cat([g[n] for n, *_ in tensors]).to(DTYPES[dtype]).to(dev)
        out = state.submit(buf, [n for n, *_ in tensors], last=True).wait()
        steps.append(out.float().cpu())
    return steps


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("alg", ["onebit", "terngrad", "topk", "dgc", "int8"])
def test_one_gpu_equals_the_same_run_on_cpu(alg: str, dtype: str) -> None:
    gpu = run_workers(_sync, 1, alg, dtype, "cuda", True, backend="nccl", timeout=300)[0]
    cpu = run_workers(_sync, 1, alg, dtype, "cpu", True, timeout=300)[0]
    for step, (a, b) in enumerate(zip(gpu, cpu, strict=True)):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True, msg=f"step {step}")


@pytest.mark.skipif(GPUS < 2, reason="needs two CUDA GPUs")
@pytest.mark.parametrize("alg", ["onebit", "topk", "dgc"])
def test_two_gpus_equal_the_reference(alg: str) -> None:
    results = run_workers(_sync, 2, alg, "float32", "cuda", True, backend="nccl", timeout=300)
    tensors = _tensors(2)
    plan = Plan(alg, {}, 2, tuple(TensorPlan(n, k, s is not AR, s, p) for n, k, s, p in tensors))
    ref = ReferenceSync(load(alg, backend="reference"), plan, 2, seed=5)
    for step in range(3):
        grads = [_grads(r, step, 2) for r in range(2)]
        if step == 1:
            grads[0]["c"][5] = float("nan")
        with single_thread():
            want = ref.step(grads)
        for rank in range(2):
            got = dict(zip([n for n, *_ in tensors],
                           results[rank][step].split([k for _, k, *_ in tensors]), strict=True))  # fmt: skip
            for name, _, strategy, _ in tensors:
                if strategy is AR:
                    torch.testing.assert_close(got[name], want[name], rtol=1e-6, atol=1e-6)
                else:
                    torch.testing.assert_close(got[name], want[name], rtol=0, atol=0,
                                               equal_nan=True)  # fmt: skip


def _no_waits(rank: int, world: int) -> None:
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from hipress.casync import register

    dev = torch.device("cuda", torch.cuda.current_device())
    model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 10)).to(dev)
    ddp = DDP(model, device_ids=[dev.index])
    register(ddp, "onebit", seed=1, log_every=0)
    x = torch.randn(64, 512, device=dev)
    for step in range(4):  # the first steps agree, compile and allocate
        if step == 3:
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
        try:
            ddp(x).square().mean().backward()
        finally:
            torch.cuda.set_sync_debug_mode("default")


def test_a_compressed_step_never_waits_for_the_gpu() -> None:
    run_workers(_no_waits, 1, backend="nccl", timeout=300)


def _first_step(rank: int, world: int, root: str) -> tuple[int, int]:
    """(files in a fresh kernel cache after register, files the first step added) on a GPU."""
    import os
    from pathlib import Path

    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from hipress.casync import register

    os.environ["HIPRESS_CACHE_DIR"] = root

    def files() -> set[Path]:
        return {p for p in Path(root).rglob("*") if p.is_file() and p.suffix != ".lock"}

    dev = torch.device("cuda", torch.cuda.current_device())
    model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 10)).to(dev)
    ddp = DDP(model, device_ids=[dev.index])
    register(ddp, "dgc", seed=1, log_every=0, rule=None)
    built = files()
    ddp(torch.randn(64, 512, device=dev)).square().mean().backward()
    torch.cuda.synchronize()
    return len(built), len(files() - built)


def test_the_first_step_on_a_gpu_compiles_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    built, added = run_workers(_first_step, 1, str(tmp_path), backend="nccl", timeout=300)[0]
    assert built > 0 and added == 0


def _auto(rank: int, world: int) -> int:
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from hipress.casync import register

    dev = torch.device("cuda", torch.cuda.current_device())
    model = nn.Sequential(nn.Linear(1024, 4096), nn.Linear(4096, 10)).to(dev)
    state = register(DDP(model, device_ids=[dev.index]), "onebit", plan="auto", log_every=0)
    return sum(e.compress for e in state.plan.entries)


@pytest.mark.skipif(GPUS < 2, reason="needs two CUDA GPUs")
def test_auto_plan_profiles_on_the_gpu() -> None:
    counts = run_workers(_auto, 2, backend="nccl", timeout=600)
    assert counts[0] == counts[1]
