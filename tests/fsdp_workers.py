"""Worker functions for tests/test_fsdp.py: each runs on every rank of a real gloo group
(:func:`dist_utils.run_workers`) and returns plain tensors and numbers for the test to check."""

from __future__ import annotations

import copy
import tempfile
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

import hipress.fsdp
from hipress.fsdp import CompressedReduceScatter, FsdpError

# ---------------------------------------------------------------- models and data


def grid_model(seed: int = 0) -> nn.Sequential:
    """Two small linear layers with weights on a 1/8 grid in [-2, 2]: every gradient of
    :func:`grid_batch` data is exactly representable in float16 (and bfloat16 products)."""
    g = torch.Generator().manual_seed(seed)
    m = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randint(-16, 17, p.shape, generator=g).float() / 8)
    return m


def grid_batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randint(-1, 2, (2, 8), generator=g).float()
    t = torch.randint(-1, 2, (2, 4), generator=g).float()
    return x, t


def shard(model: nn.Sequential, **kwargs: Any) -> nn.Sequential:
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def local(model: nn.Module) -> dict[str, torch.Tensor]:
    """This rank's shards of the parameters, float32 copies."""
    return {k: v.to_local().detach().float().clone() for k, v in model.state_dict().items()}


# ---------------------------------------------------------------- exact: fp16 vs plain FSDP2


def _grid_run(rank: int, cfg: dict[str, Any], compressed: bool) -> dict[str, torch.Tensor]:
    mp = cfg.get("mp")
    extra: dict[str, Any] = {}
    replicas = None
    if cfg.get("hsdp"):  # 2 replicas of 2 shards: FSDP2's HSDP, or 1-D FSDP2 + hipress's hook
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
        extra["mesh"] = mesh["shard"] if compressed else mesh
        replicas = mesh["replicate"].get_group()
    model = shard(grid_model(), reshard_after_forward=cfg.get("reshard", True),
                  mp_policy=mp or MixedPrecisionPolicy(), **extra)  # fmt: skip
    if cfg.get("factor"):
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.set_gradient_divide_factor(cfg["factor"])
                if not compressed:  # gloo has no PREMUL_SUM: FSDP2's sum-then-divide path
                    m.set_force_sum_reduction_for_comms(True)
    comp = None
    if compressed:
        comp = hipress.fsdp.register(model, "fp16", min_compress_numel=cfg.get("min", 1),
                                     feedback="none", replicate_group=replicas)  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), lr=0.125)
    micro = cfg.get("micro", 1)
    for step in range(3):
        opt.zero_grad()
        for k in range(micro):
            model.set_requires_gradient_sync(k == micro - 1)
            x, t = grid_batch(rank, 10 * step + k)
            (model(x).float() * t).sum().backward()
        opt.step()
        with torch.no_grad():  # stay on the grid, so the next step's gradients stay exact
            for p in model.parameters():
                p.copy_((p * 8).round().clamp(-16, 16) / 8)
    if comp is not None:  # every unit and replica hook ran; the state round-trips
        stats = comp.stats()
        assert stats["calls"] == 3 * len(comp.units)
        assert stats["compressed_calls"] == 3 * sum(u.compress for u in comp.units.values())
        assert all(r["calls"] == 3 for r in stats["replicas"].values())
        assert len(stats["replicas"]) == (len(comp.units) if replicas is not None else 0)
        sd = comp.state_dict()
        comp.load_state_dict(copy.deepcopy(sd))
        assert _same(sd, comp.state_dict())
    return local(model)


def exact_configs() -> dict[str, dict[str, Any]]:
    bf16 = torch.bfloat16
    return {
        "fp32": {},
        "no-reshard+accumulate": {"reshard": False, "micro": 2},
        "bf16-params,fp32-reduce": {"mp": MixedPrecisionPolicy(param_dtype=bf16,
                                                               reduce_dtype=torch.float32)},
        "bf16-params,bf16-reduce": {"mp": MixedPrecisionPolicy(param_dtype=bf16,
                                                               reduce_dtype=bf16)},
        "divide-factor": {"factor": 4.0},
        # the second layer (36 elements) stays FSDP2's reduce-scatter: gloo's PREMUL_SUM stand-in
        "threshold+divide-factor": {"factor": 4.0, "min": 50},
        "hsdp": {"hsdp": True},  # 4 ranks only
    }  # fmt: skip


def exact_vs_plain(rank: int, world_size: int, names: list[str]) -> dict[str, Any]:
    """Per config: (plain FSDP2's shards, hipress fp16's shards) after three steps."""
    out = {}
    for name in names:
        cfg = exact_configs()[name]
        out[name] = (_grid_run(rank, cfg, False), _grid_run(rank, cfg, True))
    return out


# ---------------------------------------------------------------- lossy training


def _teacher(seed: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    t = torch.Generator().manual_seed(1234)
    w1 = torch.randn(16, 32, generator=t) / 4
    w2 = torch.randn(32, 4, generator=t) / 6
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    return x, torch.tanh(x @ w1) @ w2


def train_loss(rank: int, world_size: int, runs: list[tuple[str, dict[str, Any]]],
               steps: int = 60) -> dict[str, tuple[float, float]]:  # fmt: skip
    """Per run (name, register kwargs, or {} for plain FSDP2): (first, last) eval loss."""
    out = {}
    for name, kwargs in runs:
        torch.manual_seed(0)
        model = shard(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)))
        if kwargs:
            hipress.fsdp.register(model, min_compress_numel=1, **kwargs)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        xs, ys = _teacher(100 + rank, 32 * steps)
        xe, ye = _teacher(999, 1024)

        first = _eval(model, xe, ye)
        for s in range(steps):
            opt.zero_grad()
            b = slice(32 * s, 32 * (s + 1))
            nn.functional.mse_loss(model(xs[b]), ys[b]).backward()
            opt.step()
        out[name] = (first, _eval(model, xe, ye))
    return out


def _eval(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float(nn.functional.mse_loss(model(x), y))


# ---------------------------------------------------------------- the collective alone


def collective(rank: int, world_size: int, cases: list[dict[str, Any]]) -> list[list[torch.Tensor]]:
    """Per case, the outputs of ``steps`` calls of a unit's reduce-scatter on generated inputs
    (rank r's input of step s: :func:`collective_input`)."""
    results = []
    for case in cases:
        alg = case["alg"]
        alg = hipress.compll.load(alg, **case.get("params", {})) if isinstance(alg, str) else alg
        rs = CompressedReduceScatter("unit", alg, case["feedback"], case["numel"], world_size,
                                     rank, torch.device("cpu"), seed=case.get("seed", 0),
                                     device_flags=case.get("device_flags"))  # fmt: skip
        outs = []
        for s in range(case["steps"]):
            inp = collective_input(case, rank, s)
            out = torch.empty(case["numel"] // world_size, dtype=inp.dtype)
            rs(out, inp, dist.group.WORLD, case["op"])
            outs.append(out)
        results.append(outs)
    return results


def collective_input(case: dict[str, Any], rank: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(7919 * step + rank)
    x = torch.randn(case["numel"], generator=g)
    for r, s, i, v in case.get("poison", ()):
        if (r, s) == (rank, step):
            x[i] = v
    return x.to(case.get("dtype", torch.float32))


# ---------------------------------------------------------------- NaN through FSDP2


def nonfinite_grads(
    rank: int, world_size: int, cases: list[tuple[str, dict[str, Any]]]
) -> list[list[tuple[list[torch.Tensor], list[torch.Tensor]]]]:
    """Per case (algorithm, register kwargs): :func:`nonfinite_case`."""
    return [nonfinite_case(rank, alg, kwargs) for alg, kwargs in cases]


def nonfinite_case(
    rank: int, alg: str, kwargs: dict[str, Any]
) -> list[tuple[list[torch.Tensor], list[torch.Tensor]]]:
    """Per step, (plain FSDP2's, hipress's) gradient shards; rank 1's input holds a NaN at
    step 1 and an Inf at step 2, steps 0 and 3 are clean."""
    out: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = []
    models = []
    for compressed in (False, True):
        torch.manual_seed(0)
        model = shard(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)))
        if compressed:
            hipress.fsdp.register(model, alg, min_compress_numel=1, **kwargs)
        models.append(model)
    for step, bad in enumerate([None, float("nan"), float("inf"), None]):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(10 * step + rank))
        if bad is not None and rank == 1:
            x[3, 5] = bad
        grads = []
        for model in models:
            model.zero_grad()
            model(x).sum().backward()
            grads.append([p.grad.to_local().clone() for p in model.parameters()])
        out.append((grads[0], grads[1]))
    return out


# ---------------------------------------------------------------- checkpoints


def resume(rank: int, world_size: int, cases: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """Per case (algorithm, feedback): :func:`resume_case`."""
    return [resume_case(world_size, alg, feedback) for alg, feedback in cases]


def resume_case(world_size: int, alg: str, feedback: str) -> dict[str, Any]:
    """Train 3 steps, checkpoint (the model's shards by hand, the compression state through
    torch.distributed.checkpoint), train 3 more; restore and train the 3 again."""
    torch.manual_seed(0)
    model = shard(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)))
    comp = hipress.fsdp.register(model, alg, min_compress_numel=1, feedback=feedback)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    xs, ys = _teacher(100 + dist.get_rank(), 32 * 6)

    def steps(a: int, b: int) -> list[dict[str, torch.Tensor]]:
        seen = []
        for s in range(a, b):
            opt.zero_grad()
            nn.functional.mse_loss(
                model(xs[32 * s : 32 * (s + 1)]), ys[32 * s : 32 * (s + 1)]
            ).backward()
            opt.step()
            seen.append(local(model))
        return seen

    steps(0, 3)
    saved_model = {k: v.to_local().clone() for k, v in model.state_dict().items()}
    sd = comp.state_dict()
    comp.load_state_dict(copy.deepcopy(sd))
    roundtrip = _same(sd, comp.state_dict())
    with tempfile.TemporaryDirectory() as tmp:
        path = [tmp]
        dist.broadcast_object_list(path)  # one directory for every rank
        dcp.save({"hipress": comp}, checkpoint_id=path[0])
        first = steps(3, 6)
        with torch.no_grad():
            for k, v in model.state_dict().items():
                v.to_local().copy_(saved_model[k])
        dcp.load({"hipress": comp}, checkpoint_id=path[0])
        dist.barrier()
    again = steps(3, 6)
    errors = []
    wrong = copy.deepcopy(sd)
    wrong["world_size"] = world_size + 1
    try:
        comp.load_state_dict(wrong)
    except FsdpError as exc:
        errors.append(str(exc))
    try:
        hipress.fsdp.register(model, alg, min_compress_numel=1, feedback=feedback)
    except FsdpError as exc:
        errors.append(str(exc))
    return {"first": first, "again": again, "roundtrip": roundtrip, "errors": errors,
            "memory": comp.memory(), "stats": comp.stats(),
            "numel": sum(u.numel for u in comp.units.values() if u.compress),
            "chunks": [n for u in comp.units.values() for n in (u.layout.shards if u.layout else ())]}  # fmt: skip


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    return a == b


# ---------------------------------------------------------------- kernels built at register


def first_step_compiles(rank: int, world_size: int, root: str) -> tuple[int, int]:
    """(files in a fresh kernel cache after register, files the first step added)."""
    import os
    from pathlib import Path

    cache = Path(root) / f"rank{rank}"
    os.environ["HIPRESS_CACHE_DIR"] = str(cache)

    def files() -> set[Path]:
        return {p for p in cache.rglob("*") if p.is_file() and p.suffix != ".lock"}

    model = shard(grid_model())
    hipress.fsdp.register(model, "onebit", min_compress_numel=1)
    built = files()
    x, t = grid_batch(rank, 0)
    nn.functional.mse_loss(model(x), t).backward()
    return len(built), len(files() - built)
