"""Worker functions for tests/test_diloco*.py: each runs on every rank of a real gloo group
(:func:`dist_utils.run_workers`) and returns plain tensors and numbers for the test to check."""

from __future__ import annotations

import io
import os
import time
from typing import Any

import torch
from torch import nn

from hipress.diloco import CommError, ConfigMismatchError, DiLoCo, DiLoCoError

# ---------------------------------------------------------------- models and data


def small_model(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def batch(rank: int, step: int, n: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """A regression batch of a fixed random linear map plus noise, different per rank and step."""
    w = torch.randn(8, 4, generator=torch.Generator().manual_seed(7))
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(n, 8, generator=g)
    return x, torch.tanh(x @ w) + 0.05 * torch.randn(n, 4, generator=g)


def inner_step(model: nn.Module, opt: torch.optim.Optimizer, rank: int, step: int) -> float:
    x, y = batch(rank, step)
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return float(loss.detach())


def outer_gradients(d: DiLoCo) -> list[torch.Tensor]:
    """Each parameter's outer gradient now (anchor - local, float32), as DiLoCo computes it."""
    return [torch.sub(a.float(), p.detach().float()).reshape(-1)
            for a, (_, p) in zip(d.anchors, d.named, strict=True)]  # fmt: skip


def record_means(d: DiLoCo) -> list[list[torch.Tensor]]:
    """Instrument ``d`` so every outer step's mean outer gradients are kept (the list returned)."""
    seen: list[list[torch.Tensor]] = []
    real = d.outer_step

    def outer_step(k: int, means: list[torch.Tensor]) -> None:
        seen.append([m.clone() for m in means])
        real(k, means)

    d.outer_step = outer_step  # type: ignore[method-assign]
    return seen


# ---------------------------------------------------------------- exactness


def dyadic_rounds(rank: int, world: int, algorithm: Any, rounds: int, lr: float = 0.7,
                  momentum: float = 0.9) -> dict[str, Any]:  # fmt: skip
    """Outer syncs of hand-set local weights: weights start on a 1/64 grid and each round rank
    r's weights are the anchor minus a delta on that grid. With ``lr`` and ``momentum`` powers
    of two the anchors stay on a grid and any summation order is exact. Returns the start, the
    outer gradients of every round (as DiLoCo computes them) and the weights after each round."""
    model = small_model()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_((p * 64).round() / 64)
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    outer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, nesterov=True)
    d = DiLoCo(model, inner, sync_every=2, algorithm=algorithm, outer_optimizer=outer)
    params = [p for p in model.parameters()]
    out: dict[str, Any] = {"start": [p.detach().clone() for p in params], "deltas": [],
                           "after": []}  # fmt: skip
    for t in range(rounds):
        g = torch.Generator().manual_seed(100 * t + rank)
        deltas = [torch.randint(-64, 65, p.shape, generator=g).float() / 64 for p in params]
        d.step()
        with torch.no_grad():
            for p, a, dl in zip(params, d.anchors, deltas, strict=True):
                p.copy_(a - dl)
        out["deltas"].append([g.view(p.shape) for g, p in zip(outer_gradients(d), params,
                                                               strict=True)])  # fmt: skip
        d.step()
        out["after"].append([p.detach().clone() for p in params])
    return out


def trained_rounds(rank: int, world: int, algorithm: Any, rounds: int, h: int = 3,
                   **kw: Any) -> dict[str, Any]:  # fmt: skip
    """Real inner SGD steps; returns each sync's outer gradients (this rank's, as sent) and the
    means applied, with the parameter names."""
    model = small_model()
    inner = torch.optim.SGD(model.parameters(), lr=0.05)
    d = DiLoCo(model, inner, sync_every=h, algorithm=algorithm, **kw)
    seen = record_means(d)
    sent = []
    for step in range(1, rounds * h + 1):
        inner_step(model, inner, rank, step)
        if step % h == 0:
            sent.append(outer_gradients(d))
        d.step()
    return {"names": [n for n, _ in d.named], "sent": sent, "means": seen,
            "params": [p.detach().clone() for p in model.parameters()]}  # fmt: skip


def mass(rank: int, world: int, algorithm: str, rounds: int) -> dict[str, Any]:
    """Outer SGD with lr 1 and no momentum, so the anchor moves by exactly the applied means:
    returns the anchor's total move, this rank's sum of sent outer gradients and what its
    error feedback still owes."""
    model = small_model()
    inner = torch.optim.SGD(model.parameters(), lr=0.05)
    outer = torch.optim.SGD(model.parameters(), lr=1.0)
    d = DiLoCo(model, inner, sync_every=2, algorithm=algorithm, outer_optimizer=outer)
    start = [a.clone() for a in d.anchors]
    total = [torch.zeros(a.numel()) for a in d.anchors]
    for step in range(1, 2 * rounds + 1):
        inner_step(model, inner, rank, step)
        if step % 2 == 0:
            for tot, g in zip(total, outer_gradients(d), strict=True):
                tot.add_(g)
        d.step()
    moved = [(s - a).reshape(-1) for s, a in zip(start, d.anchors, strict=True)]
    return {"moved": moved, "sent": total, "owed": list(d.owed().values())}


# ---------------------------------------------------------------- checkpoints


def _build(kw: dict[str, Any]) -> tuple[nn.Module, torch.optim.Optimizer, DiLoCo]:
    """The small model, AdamW inner steps, and DiLoCo with ``kw`` (``outer``: the keyword
    arguments of an outer SGD, instead of the default)."""
    model = small_model()
    inner = torch.optim.AdamW(model.parameters(), lr=0.01)
    kw = dict(kw)
    outer = kw.pop("outer", None)
    if outer is not None:
        kw["outer_optimizer"] = torch.optim.SGD(model.parameters(), **outer)
    return model, inner, DiLoCo(model, inner, **kw)


def resume(rank: int, world: int, kw: dict[str, Any], stop: int, total: int,
           saved: list[bytes] | None, with_diloco: bool = True) -> dict[str, Any]:  # fmt: skip
    """Train ``total`` inner steps (``with`` block), saving model, inner optimizer and DiLoCo
    after step ``stop``; or, given ``saved`` (each rank's bytes), load them and train from
    ``stop``. Returns the bytes saved and the final weights and counters."""
    model, inner, d = _build(kw)
    first, blob = 1, b""
    if saved is not None:
        sd = torch.load(io.BytesIO(saved[rank]), weights_only=False)
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["inner"])
        if with_diloco:
            d.load_state_dict(sd["diloco"])
        first = stop + 1
    with d:
        for step in range(first, total + 1):
            inner_step(model, inner, rank, step)
            if step == stop and saved is None:
                buf = io.BytesIO()
                torch.save({"model": model.state_dict(), "inner": inner.state_dict(),
                            "diloco": d.state_dict()}, buf)  # fmt: skip
                blob = buf.getvalue()
    return {"saved": blob, "params": [p.detach().clone() for p in model.parameters()],
            "syncs": d.stats.per_fragment, "inner_steps": d.stats.inner_steps}  # fmt: skip


def load_errors(rank: int, world: int) -> list[str]:
    """Messages of loading damaged or foreign state dicts; checks nothing changed."""
    model, inner, d = _build({"sync_every": 2, "algorithm": "onebit"})
    for step in range(1, 5):
        inner_step(model, inner, rank, step)
        d.step()
    good = d.state_dict()
    stranger = small_model()
    other = DiLoCo(stranger, torch.optim.SGD(stranger.parameters(), lr=0.1), sync_every=3,
                   algorithm="onebit")  # fmt: skip
    bad_anchor = {**good, "anchors": {**good["anchors"], "0.weight": torch.zeros(2)}}
    bad_codec = dict(good)
    bad_codec["codecs"] = {**good["codecs"], "2.bias": {"alg": {}, "last": torch.zeros(1)}}
    msgs = []
    for sd in ({"format": "x"}, {**good, "rank": 1 - rank}, other.state_dict(), bad_anchor,
               bad_codec, {k: v for k, v in good.items() if k != "anchors"}):  # fmt: skip
        before = d.state_dict()
        try:
            d.load_state_dict(sd)
        except DiLoCoError as exc:
            msgs.append(str(exc))
        after = d.state_dict()
        for a, b in zip(before["anchors"].values(), after["anchors"].values(), strict=True):
            assert torch.equal(a, b)
        for k in before["codecs"]:
            assert torch.equal(before["codecs"][k]["alg"]["tensors"]["comp"],
                               after["codecs"][k]["alg"]["tensors"]["comp"])  # fmt: skip
    return msgs


# ---------------------------------------------------------------- failures


def mismatch(rank: int, world: int, kw: dict[str, Any]) -> str:
    """Rank 1 passes ``kw`` on top of rank 0's options; returns the ConfigMismatchError."""
    base: dict[str, Any] = {"sync_every": 4, "algorithm": "onebit"}
    try:
        _build({**base, **kw} if rank == 1 else base)
    except ConfigMismatchError as exc:
        return str(exc)
    return "no error"


def dead_peer(rank: int, world: int, h: int) -> dict[str, Any]:
    """The last rank exits silently before the first outer sync; the others' sync must raise
    CommError in bounded time."""
    model, inner, d = _build({"sync_every": h, "algorithm": "onebit"})
    began = time.monotonic()
    try:
        with d:
            for step in range(1, 3 * h):
                if step == h and rank == world - 1:
                    os._exit(0)
                inner_step(model, inner, rank, step)
    except CommError as exc:
        return {"error": str(exc), "seconds": time.monotonic() - began}
    return {"error": None}


def nan_rounds(rank: int, world: int, algorithm: Any) -> dict[str, Any]:
    """Rank 1 puts a NaN in the first layer's weight just before the first sync; returns which
    parameters are finite after it and after a second sync."""
    model, inner, d = _build({"sync_every": 2, "algorithm": algorithm})
    finite = []
    for step in range(1, 5):
        inner_step(model, inner, rank, step)
        if step == 2 and rank == 1:
            with torch.no_grad():
                model[0].weight[0, 0] = float("nan")
        d.step()
        if step % 2 == 0:
            finite.append({n: bool(p.isfinite().all()) for n, p in model.named_parameters()})
    return {"finite": finite, "nan_weights": int(model[0].weight.isnan().sum())}


def bad_arguments(rank: int, world: int) -> list[str]:
    """The DiLoCoError message of each bad argument (one process)."""
    model = small_model()
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    stranger = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    cases: list[dict[str, Any]] = [
        {"sync_every": 0}, {"sync_every": 4, "algorithm": "nope"},
        {"sync_every": 4, "algorithm": "topk", "params": {"ratio": 7}},
        {"sync_every": 4, "fragments": 2, "fragment_sync_delay": 2},
        {"sync_every": 1, "fragments": 2}, {"sync_every": 4, "fragment_update_alpha": 2},
        {"sync_every": 4, "outer_optimizer": stranger},
        {"sync_every": 4, "outer_optimizer": inner},
        {"sync_every": 4, "algorithm": "onebit", "feedback": "none"},
        {"sync_every": 4, "feedback": "int4"},
        {"sync_every": 4, "fragments": [model[0], model[0]]},
        {"sync_every": 4, "fragments": [model[0]]},
        {"sync_every": 4, "algorithm": {"0.weight": "onebit"}},
    ]  # fmt: skip
    msgs = []
    for kw in cases:
        try:
            DiLoCo(model, inner, **kw)
            msgs.append(f"no error for {kw}")
        except DiLoCoError as exc:
            msgs.append(str(exc))
    from torch.distributed.fsdp import fully_shard

    sharded = small_model()
    fully_shard(sharded[0])  # sharded and plain parameters mixed
    try:
        DiLoCo(sharded, torch.optim.SGD(sharded.parameters(), lr=0.1), sync_every=4)
    except DiLoCoError as exc:
        msgs.append(str(exc))
    d = DiLoCo(model, inner, sync_every=4)
    with d:
        try:
            d.step()
        except DiLoCoError as exc:
            msgs.append(str(exc))
    return msgs


# ---------------------------------------------------------------- training


def train_loss(rank: int, world: int, kw: dict[str, Any], steps: int) -> float:
    """Train with AdamW inner steps; return the mean loss of the final weights on held-out
    batches (the same on every rank once synchronised)."""
    model, inner, d = _build(kw)
    with d:
        for step in range(1, steps + 1):
            inner_step(model, inner, rank, step)
    with torch.no_grad():
        xs = [batch(99, 10_000 + i, 64) for i in range(4)]
        return sum(float(nn.functional.mse_loss(model(x), y)) for x, y in xs) / 4


# ---------------------------------------------------------------- streaming and replicas


def streaming(rank: int, world: int, alpha: float, algorithm: Any = None) -> list[dict[str, Any]]:
    """Two fragments, H = 4, tau = 1, outer SGD lr 1: per inner step, what started and what was
    applied, the outer gradients at each start, the weights just before the step's syncs and
    the anchors and weights after."""
    model = small_model()
    inner = torch.optim.SGD(model.parameters(), lr=0.05)
    d = DiLoCo(model, inner, sync_every=4, algorithm=algorithm, fragments=2,
               fragment_sync_delay=1, fragment_update_alpha=alpha,
               outer_optimizer=torch.optim.SGD(model.parameters(), lr=1.0))  # fmt: skip
    out = []
    for step in range(1, 13):
        inner_step(model, inner, rank, step)
        before = [p.detach().clone() for p in model.parameters()]
        rec = {"frags": [list(f) for f in d.frags], "starts": d.schedule.starts(step),
               "applies": d.schedule.applies(step), "sent": outer_gradients(d),
               "before": before, "anchors_before": [a.clone() for a in d.anchors]}  # fmt: skip
        d.step()
        rec["after"] = [p.detach().clone() for p in model.parameters()]
        rec["anchors"] = [a.clone() for a in d.anchors]
        out.append(rec)
    return out


def replicas(rank: int, world: int, algorithm: Any, steps: int) -> dict[str, Any]:
    """Two replicas of two ranks: DDP inside each ({0, 1}, {2, 3}), DiLoCo across them over
    {0, 2} and {1, 3}. Returns the weights after every step and the final held-out loss."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    inside = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    across = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    replica, local = divmod(rank, 2)
    torch.manual_seed(replica)  # the replicas start apart: DiLoCo takes rank 0's weights
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    ddp = DDP(model, process_group=inside[replica])
    inner = torch.optim.AdamW(model.parameters(), lr=0.01)
    d = DiLoCo(model, inner, sync_every=4, algorithm=algorithm, process_group=across[local])
    weights = []
    with d:
        for step in range(1, steps + 1):
            x, y = batch(rank, step)
            inner.zero_grad()
            nn.functional.mse_loss(ddp(x), y).backward()
            inner.step()
            weights.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    return {"weights": weights, "sent": d.stats.sent_bytes, "syncs": d.stats.syncs}


# ---------------------------------------------------------------- devices


def on_device(rank: int, world: int, device: str, algorithm: Any, nan: bool) -> list[Any]:
    """Three outer syncs of hand-set local weights on ``device`` ("cuda": this rank's GPU);
    with ``nan`` the second round's outer gradient of the first weight holds a NaN. Returns the
    weights after each round (CPU) and the codec memory after the last."""
    dev = torch.device(device if device == "cpu" else f"cuda:{torch.cuda.current_device()}")
    model = small_model().to(dev)
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    d = DiLoCo(model, inner, sync_every=1, algorithm=algorithm)
    params = list(model.parameters())
    out: list[Any] = []
    for t in range(3):
        g = torch.Generator().manual_seed(100 * t + rank)
        with torch.no_grad():
            for p, a in zip(params, d.anchors, strict=True):
                p.copy_(a - (torch.randint(-64, 65, p.shape, generator=g).float() / 64).to(dev))
            if nan and t == 1:
                params[0][0, 0] = float("nan")
        d.step()
        out.append([p.detach().cpu().clone() for p in params])
    out.append({n: v.cpu() for n, v in d.owed().items()})
    return out


def auto(rank: int, world: int, step_ms: float | None) -> dict[str, Any]:
    """plan="auto" with a fixed profile, two fragments: which codec each parameter got, the
    predicted utilisation, and the weights after a period (the same on every rank)."""
    from hipress.secopa.model.profile import affine_profile

    profile = affine_profile("onebit", encode=(0, 10, 10), decode=(0, 4, 4), merge=(0, 0, 0),
                             bytes_per_element=1 / 8, header=8, bandwidth_bytes_per_s=16000,
                             latency_s=1e-4)  # fmt: skip
    model = small_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    d = DiLoCo(model, opt, 4, "onebit", fragments=[model[0], model[2]], plan="auto", profile=profile,
               inner_step_ms=step_ms)  # fmt: skip
    with d:
        for s in range(4):
            inner_step(model, opt, rank, s)
    return {
        "codecs": {n: a.name for n, a in d.algorithms.items()},
        "compress": [c.compress for c in d.auto.plan.fragments],
        "utilisation": d.auto.utilisation,
        "anchors": [a.clone() for a in d.anchors],  # the global weights
    }


# ---------------------------------------------------------------- many cases, one launch


def each(rank: int, world: int, calls: list[tuple[Any, ...]]) -> list[Any]:
    """The functions above named by ``calls`` (``(name, args)`` or ``(name, args, kwargs)``),
    in turn in one process group, so the cases of a test module share one launch; their
    results in order. Each function builds its model, data and DiLoCo from fixed seeds, so it
    returns what it returns alone."""
    return [globals()[name](rank, world, *args, **(kw[0] if kw else {}))
            for name, args, *kw in calls]  # fmt: skip


# ---------------------------------------------------------------- FSDP2 inside a replica


def _meshes(world: int) -> Any:
    """A (replica, shard) DeviceMesh: two replicas of ``world // 2`` ranks."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replica", "shard"))


def _uneven_model() -> nn.Sequential:
    # 15 rows do not split evenly over two ranks: FSDP2 gives 8 and 7
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 15), nn.Tanh(), nn.Linear(15, 4))


def _sharded(model: nn.Sequential, mesh: Any) -> nn.Sequential:
    from torch.distributed.fsdp import fully_shard

    for m in model:
        if isinstance(m, nn.Linear):
            fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _wrap(mesh: Any, fsdp: bool) -> tuple[nn.Module, nn.Module]:
    """The model, and what the training loop calls: FSDP2 over the replica's ranks, or DDP."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = _uneven_model()
    if fsdp:
        return _sharded(model, mesh["shard"]), model
    return model, DDP(model, process_group=mesh["shard"].get_group())


def _full(model: nn.Module) -> list[torch.Tensor]:
    """Whole parameters (gathered, for the test to compare; DiLoCo never gathers them)."""
    return [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for p in model.parameters()]  # fmt: skip


def fsdp_vs_ddp(rank: int, world: int, fsdp: bool, kw: dict[str, Any], steps: int,
                mesh: Any = None) -> dict[str, Any]:  # fmt: skip
    """``steps`` AdamW steps of two replicas, FSDP2 (or DDP) inside each, DiLoCo with ``kw``
    across them over the replica dimension. Returns the whole weights after every outer sync
    and the held-out loss at the start and the end."""
    mesh = mesh if mesh is not None else _meshes(world)
    model, call = _wrap(mesh, fsdp)
    inner = torch.optim.AdamW(model.parameters(), lr=0.02)
    d = DiLoCo(model, inner, process_group=mesh["replica"].get_group(), **kw)
    x, y = batch(99, 0, 64)
    held = [float(nn.functional.mse_loss(call(x), y).detach())]
    weights = []
    with d:
        for step in range(1, steps + 1):
            xb, yb = batch(rank, step)
            inner.zero_grad()
            nn.functional.mse_loss(call(xb), yb).backward()
            done = d.stats.syncs
            inner.step()
            if d.stats.syncs != done:
                weights.append(_full(model))
    held.append(float(nn.functional.mse_loss(call(x), y).detach()))
    return {"weights": weights, "held": held, "syncs": d.stats.syncs,
            "owed": {n: v.shape for n, v in d.owed().items()}}  # fmt: skip


def _rows_state(sd: Any) -> Any:
    """A state dict with every DTensor replaced by this rank's rows (what torch.save keeps)."""
    from hipress.diloco.shards import local

    if isinstance(sd, torch.Tensor):
        return local(sd).clone()
    if isinstance(sd, dict):
        return {k: _rows_state(v) for k, v in sd.items()}
    if isinstance(sd, list | tuple):
        return type(sd)(_rows_state(v) for v in sd)
    return sd


def fsdp_resume(rank: int, world: int, kw: dict[str, Any], stop: int, total: int) -> bool:
    """FSDP2 inside two replicas trained ``total`` steps straight (saving this rank's state
    after ``stop``: its rows of the weights, the inner optimizer, DiLoCo), then a fresh model,
    optimizers and DiLoCo loaded from those bytes and trained from ``stop``: whether the
    weights end bit for bit equal."""
    from hipress.diloco.shards import local, rewrap_state

    mesh = _meshes(world)
    runs, blob = [], b""
    for resumed in (False, True):
        model, _ = _wrap(mesh, True)
        inner = torch.optim.AdamW(model.parameters(), lr=0.02)
        d = DiLoCo(model, inner, process_group=mesh["replica"].get_group(), **kw)
        first = 1
        if resumed:
            sd = torch.load(io.BytesIO(blob), weights_only=True)
            with torch.no_grad():
                for p, rows in zip(model.parameters(), sd["model"], strict=True):
                    local(p).copy_(rows)
            inner.load_state_dict(sd["inner"])
            rewrap_state(inner)
            d.load_state_dict(sd["diloco"])
            first = stop + 1
        with d:
            for step in range(first, total + 1):
                inner_step(model, inner, rank, step)
                if step == stop and not resumed:
                    buf = io.BytesIO()
                    torch.save({"model": [local(p) for p in model.parameters()],
                                "inner": _rows_state(inner.state_dict()),
                                "diloco": d.state_dict()}, buf)  # fmt: skip
                    blob = buf.getvalue()
        runs.append(_full(model))
    return all(torch.equal(a, b) for a, b in zip(*runs, strict=True))


def fsdp_errors(rank: int, world: int) -> list[str]:
    """The refused FSDP2 configurations, each error's type and message: a process group that
    pairs different shards (two ways), sharded and plain parameters mixed."""
    import torch.distributed as dist

    mesh = _meshes(world)
    out = []
    cases = [
        lambda: (_sharded(_uneven_model(), mesh["shard"]), dist.group.WORLD, {}),
        lambda: (_sharded(_uneven_model(), mesh["shard"]), mesh["shard"].get_group(), {}),
        lambda: (_mixed(mesh), mesh["replica"].get_group(), {}),
    ]
    for make in cases:
        model, group, kw = make()
        inner = torch.optim.SGD(model.parameters(), lr=0.1)
        try:
            DiLoCo(model, inner, sync_every=2, process_group=group, **kw)
            out.append("accepted")
        except (ConfigMismatchError, DiLoCoError) as exc:
            out.append(f"{type(exc).__name__}: {exc}")
    return out


def _mixed(mesh: Any) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    model = _uneven_model()
    fully_shard(model[0], mesh=mesh["shard"])  # model[2] stays plain
    return model


def fsdp_auto(rank: int, world: int) -> dict[str, Any]:
    """plan="auto" per shard with a fixed profile, two fragments, FSDP2 inside two replicas:
    the codec each parameter got here, and the anchors (this rank's rows of the global
    weights)."""
    from hipress.secopa.model.profile import affine_profile

    profile = affine_profile("onebit", encode=(0, 10, 10), decode=(0, 4, 4), merge=(0, 0, 0),
                             bytes_per_element=1 / 8, header=8, bandwidth_bytes_per_s=16000,
                             latency_s=1e-4)  # fmt: skip
    mesh = _meshes(world)
    model, _ = _wrap(mesh, True)
    opt = torch.optim.AdamW(model.parameters(), lr=0.02)
    d = DiLoCo(model, opt, 4, "onebit", fragments=[model[0], model[2]], plan="auto",
               profile=profile, inner_step_ms=5.0, process_group=mesh["replica"].get_group())
    with d:
        for s in range(1, 5):
            inner_step(model, opt, rank, s)
    return {"codecs": {n: a.name for n, a in d.algorithms.items()},
            "anchors": [a.clone() for a in d.anchors], "syncs": d.stats.syncs}  # fmt: skip
