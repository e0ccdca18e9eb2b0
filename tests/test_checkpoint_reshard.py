"""Error feedback saved at N ranks resumes at M: every algorithm's not-yet-sent mass is read
out of its state and written into another exactly, and CaSync checkpoints move 2 -> 4 -> 2
ranks in real gloo runs keeping the sums over ranks (up to float rounding: formed in float64,
each share rounded once to float32) and training on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from dist_utils import run_workers
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from hipress.casync import CaSyncError, register
from hipress.codec.residual import mass_of, with_mass
from hipress.compll import load
from hipress.core.plan import Plan, Strategy, TensorPlan

CASES = {
    "onebit": {}, "efsignsgd": {}, "blocksign": {"chunk": 64}, "topk": {"ratio": 0.1},
    "randomk": {"ratio": 0.1}, "tbq": {},
    "graddrop": {"drop_ratio": 0.9, "sample_rate": 0.5},
    "dgc": {"s_percent": 0.1, "sample_rate": 0.5},
    "dgc-masking": {"s_percent": 0.1, "sample_rate": 0.5, "masking": True},
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_state_written_from_its_mass_encodes_like_the_original(case: str) -> None:
    alg = load(case.split("-")[0], backend="reference", **CASES[case])
    n, gen = 1000, torch.Generator().manual_seed(1)
    state = alg.init_state(n, seed=7, tensor_id=3)
    for _ in range(3):
        alg.encode(torch.randn(n, generator=gen), state)
    mass = mass_of(alg.name, alg.params, state.state_dict()["tensors"])
    assert mass and all(bool(v.any()) for v in mass.values())
    fresh = alg.init_state(n, seed=7, tensor_id=3)
    sd = fresh.state_dict()
    sd["tensors"], sd["step"] = with_mass(alg.name, sd["tensors"], mass), state.step
    fresh.load_state_dict(sd)
    g = torch.randn(n, generator=gen)
    assert torch.equal(alg.encode(g, state), alg.encode(g, fresh))  # the same c, bit for bit


def test_stateless_and_unknown_algorithms() -> None:
    assert mass_of("terngrad", {}, {}) == {}
    assert mass_of("mine", {}, {"acc": torch.ones(3)}) is None


# ---- 2 -> 4 -> 2 ranks, real gloo runs --------------------------------------------------------


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 96), nn.ReLU(),
                         nn.Linear(96, 8))  # fmt: skip


def _plan(world_size: int) -> Plan:
    how = {"0.weight": (Strategy.PS, 2), "2.weight": (Strategy.ALLGATHER, 1),
           "4.weight": (Strategy.RING, 1)}  # fmt: skip
    entries = tuple(
        TensorPlan(n, p.numel(), n in how, *how.get(n, (Strategy.ALLREDUCE, 1)))
        for n, p in _model().named_parameters()
    )
    return Plan("onebit", {}, world_size, entries)


def _train(ddp: DDP, opt: torch.optim.Optimizer, rank: int, steps: range) -> None:
    for step in steps:
        gen = torch.Generator().manual_seed(1000 * step + rank)
        opt.zero_grad()
        x, y = torch.randn(16, 32, generator=gen), torch.randn(16, 8, generator=gen)
        nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()


def _sums(every: dict[str, Any]) -> dict[str, float]:
    """Per chunk and side (worker/server): the mass summed over ranks, states and elements."""
    out: dict[str, float] = {}
    for sd in every["ranks"]:
        for part in ("worker", "server"):
            for key, st in sd[part].items():
                mass = mass_of("onebit", {}, st["tensors"])
                assert mass is not None
                chunk = key.rpartition(".")[0] if "." in key.rpartition("#")[2] else key
                side = f"{chunk.removesuffix('@server')} {part}"
                out[side] = out.get(side, 0.0) + float(mass["residual"].double().sum())
    return out


def _elementwise(every: dict[str, Any], key: str) -> torch.Tensor:
    """An all-gather chunk's worker mass summed over ranks, per element."""
    return sum(
        mass_of("onebit", {}, sd["worker"][key]["tensors"])["residual"].double()
        for sd in every["ranks"]
    )  # type: ignore[index,return-value]


def _leg(rank: int, world_size: int, src: str | None, dst: str, start: int) -> Any:
    ddp = DDP(_model(), bucket_cap_mb=0.02)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    # resumed: plan="auto" takes the saved plan, laid out for this world size
    state = register(ddp, "onebit", plan="auto" if src else _plan(world_size), log_every=0)
    before = None
    if src is not None:
        saved = torch.load(src)
        state.load_state_dict(saved)  # resharded from the saved world size
        before = (_sums(saved), _elementwise(saved, "2.weight#0/1"))
        after = state.gathered_state_dict()
        before = (before, (_sums(after), _elementwise(after, "2.weight#0/1")))
        assert state.state_dict()["step"] == start
        assert state.plan.entries == _plan(world_size).entries
    _train(ddp, opt, rank, range(start, start + 2))
    every = state.gathered_state_dict()
    if rank == 0:
        torch.save(every, dst)
    if src is None:  # the Accelerate helper's form: the main process's state, a file per rank
        from hipress.integrations.accelerate import GatheredCheckpoint

        Path(f"{dst}.acc").mkdir(exist_ok=True)
        GatheredCheckpoint(state).save_hook(None, None, f"{dst}.acc")
        if rank == 0:
            torch.save(GatheredCheckpoint(state).state_dict(), f"{dst}.acc/main.pt")
    dist.barrier()
    assert all(bool(p.isfinite().all()) for p in ddp.parameters())
    if src is not None:  # (after training: a second state's hooks would join the optimizer's)
        other = register(DDP(_model()), "onebit", plan=_plan(world_size), log_every=0)
        with pytest.raises(CaSyncError, match=r"gathered\(\[sd_0, sd_1, ...\], \d\)"):
            other.load_state_dict(torch.load(src)["ranks"][0])  # one rank's: not resharded
    if Path(f"{src}.acc").exists():  # the Accelerate helper's files reshard alike
        from hipress.integrations.accelerate import GatheredCheckpoint

        kept = GatheredCheckpoint(register(DDP(_model()), "onebit", plan=_plan(world_size)))
        kept.load_hook(None, f"{src}.acc")
        kept.load_state_dict(torch.load(f"{src}.acc/main.pt"))
        assert _sums(kept.state.gathered_state_dict()) == before[1][0]
    return before


def _same(old: Any, new: Any) -> None:
    (sums_a, elem_a), (sums_b, elem_b) = old, new
    assert set(sums_a) == set(sums_b)
    for side, a in sums_a.items():
        assert abs(sums_b[side] - a) <= 1e-6 * max(1.0, abs(a)), side
    scale = float(elem_a.abs().max())
    assert float((elem_b - elem_a).abs().max()) <= 1e-6 * scale and scale > 0


def test_error_feedback_moves_from_2_to_4_to_2_ranks_keeping_its_sums(tmp_path: Path) -> None:
    two, four, back = (str(tmp_path / f) for f in ("two.pt", "four.pt", "back.pt"))
    run_workers(_leg, 2, None, two, 0, timeout=120)
    for got in run_workers(_leg, 4, two, four, 2, timeout=180):  # 2 -> 4
        _same(*got)
    for got in run_workers(_leg, 2, four, back, 4, timeout=120):  # 4 -> 2
        _same(*got)
    assert torch.load(back)["world_size"] == 2
