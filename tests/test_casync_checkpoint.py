"""CaSync checkpoints on real gloo groups: the plan travels with the state (``plan="auto"``
resumes in fresh processes without planning again), the gathered form that rank 0 alone writes,
a state built before ``init_process_group``, and the API's errors."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from dist_utils import run_workers
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import hipress
from hipress.casync import CaSyncError, CaSyncState, casync_hook, register
from hipress.codec import planning
from hipress.core.plan import Plan, Strategy, TensorPlan


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 96), nn.ReLU(),
                         nn.Linear(96, 8))  # fmt: skip


def _train(ddp: DDP, opt: torch.optim.Optimizer, rank: int, steps: range) -> None:
    for step in steps:
        gen = torch.Generator().manual_seed(10_000 + 100 * step + rank)
        x, y = torch.randn(16, 32, generator=gen), torch.randn(16, 8, generator=gen)
        opt.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()


def _no_planning(*args: object, **kwargs: object) -> Plan:
    raise AssertionError("plan='auto' planned again instead of taking the checkpoint's plan")


# ---- plan="auto": save, restart in fresh processes, resume bit-exact ------------------------


def _first_run(rank: int, world_size: int, path: str) -> tuple[list[torch.Tensor], str]:
    model = _model(0)
    ddp = DDP(model, bucket_cap_mb=0.02)
    # fallback=False: the timed plan check at step 5 (after the checkpoint; a resumed run
    # skips it) only warns, so a loaded machine cannot change this run's plan
    state = register(ddp, "onebit", plan="auto", log_every=0, fallback=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    _train(ddp, opt, rank, range(3))
    casync = state.gathered_state_dict()  # a collective: every rank calls it
    if rank == 0:  # the framework's way: one file, written by rank 0
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "casync": casync}, path)
    dist.barrier()
    _train(ddp, opt, rank, range(3, 6))
    return [p.detach().clone() for p in model.parameters()], state.plan.digest()


def _resumed_run(rank: int, world_size: int, path: str) -> tuple[list[torch.Tensor], str]:
    planning._auto_plan = _no_planning  # type: ignore[assignment]  # (this process only)
    ckpt = torch.load(path)
    model = _model(1)  # other initial weights: the checkpoint must win
    ddp = DDP(model, bucket_cap_mb=0.02)
    state = register(ddp, "onebit", plan="auto", log_every=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["opt"])
    state.load_state_dict(ckpt["casync"])  # takes its own entry and the saved plan
    assert state.plan == CaSyncState.plan_of(ckpt["casync"])
    _train(ddp, opt, rank, range(3, 6))
    return [p.detach().clone() for p in model.parameters()], state.plan.digest()


def test_auto_plan_resumes_bit_exact_from_a_gathered_checkpoint(tmp_path: Path) -> None:
    path = str(tmp_path / "ckpt.pt")
    straight = run_workers(_first_run, 2, path, timeout=180)
    resumed = run_workers(_resumed_run, 2, path, timeout=120)  # fresh processes
    for (want, plan_a), (got, plan_b) in zip(straight, resumed, strict=True):
        assert plan_a == plan_b
        assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))


# ---- the gathered form, per-rank form and their errors ---------------------------------------


def _plan(model: nn.Module, world_size: int, strategy: Strategy = Strategy.PS) -> Plan:
    entries = tuple(
        TensorPlan(n, p.numel(), p.numel() > 1000, strategy if p.numel() > 1000 else
                   Strategy.ALLREDUCE)
        for n, p in model.named_parameters()
    )  # fmt: skip
    return Plan("onebit", {}, world_size, entries)


def _forms(rank: int, world_size: int) -> list[str]:
    model = _model(0)
    ddp = DDP(model, bucket_cap_mb=0.02)
    plan = _plan(model, world_size)
    state = register(ddp, "onebit", plan=plan, log_every=0)
    _train(ddp, torch.optim.SGD(model.parameters(), lr=0.05), rank, range(2))
    one, every = state.state_dict(), state.gathered_state_dict()
    assert every["format"] == "hipress.casync.gathered/1" and every["world_size"] == world_size
    assert [sd["rank"] for sd in every["ranks"]] == list(range(world_size))
    assert CaSyncState.plan_of(one) == CaSyncState.plan_of(every) == plan
    blob = pickle.loads(pickle.dumps(every))
    state.load_state_dict(blob)  # each rank its own entry
    state.load_state_dict(one)  # and still the per-rank form
    errors = []
    bigger = {**every, "world_size": 3, "ranks": [*every["ranks"], every["ranks"][0]]}
    other = register(DDP(_model(0)), "onebit", plan=_plan(model, world_size, Strategy.ALLGATHER))
    for target, sd in [(state, bigger), (other, every), (other, one)]:
        with pytest.raises(CaSyncError) as info:
            target.load_state_dict(sd)
        errors.append(str(info.value))
    # carry_over: the parameters planned alike keep their states, the others start afresh
    entries = tuple(
        TensorPlan(e.name, e.numel, True, Strategy.ALLGATHER, 1) if e.name == "2.weight" else e
        for e in plan.entries
    )
    moved = register(DDP(_model(0)), "onebit", plan=Plan("onebit", {}, world_size, entries))
    moved.load_state_dict(every, carry_over=True)
    assert moved.state_dict()["step"] == one["step"] == 2
    carried = 0
    for key, s in moved.worker_states.items():
        tensors = s.state_dict()["tensors"]
        if key.startswith("2.weight#"):
            assert all(not t.any() for t in tensors.values()), key
        else:
            want = state.worker_states[key].state_dict()["tensors"]
            assert all(torch.equal(tensors[k], want[k]) for k in want) and want, key
            carried += sum(bool(t.any()) for t in want.values())
    assert carried > 0  # (residuals that were not zero came over)
    return errors


def test_gathered_and_per_rank_forms_load_and_mismatches_say_what_to_do() -> None:
    for rank, (world, plan_g, plan_1) in enumerate(run_workers(_forms, 2)):
        # (a real checkpoint of 3 ranks would be resharded: test_checkpoint_reshard.py)
        assert "damaged gathered state dict: entry 0 is not rank 0 of 3's" in world
        for msg in (plan_g, plan_1):
            assert msg.startswith(f"rank {rank}: the state dict was saved with a different plan")
            assert "plan=CaSyncState.plan_of(checkpoint)" in msg


# ---- a state built before init_process_group (Lightning's DDPStrategy(ddp_comm_state=...)) ---


def _before_init(rank: int, world_size: int, store_path: str) -> tuple[int, list[torch.Tensor]]:
    dist.destroy_process_group()
    model = _model(0)
    state = CaSyncState("onebit", named_parameters=model.named_parameters(), log_every=0)
    assert state.rank is None  # nothing bound yet; the options were checked already
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    ddp = DDP(model, bucket_cap_mb=0.02)
    ddp.register_comm_hook(state, casync_hook)  # what Lightning does with ddp_comm_state
    _train(ddp, torch.optim.SGD(model.parameters(), lr=0.05), rank, range(3))
    # the same as the state made by register once the group exists
    model2 = _model(0)
    ddp2 = DDP(model2, bucket_cap_mb=0.02)
    register(ddp2, "onebit", log_every=0)
    _train(ddp2, torch.optim.SGD(model2.parameters(), lr=0.05), rank, range(3))
    same = [torch.equal(a, b) for a, b in zip(model.parameters(), model2.parameters(), strict=True)]
    assert all(same), same
    return state.rank, [p.detach().clone() for p in model.parameters()]


def test_a_state_built_before_the_process_group_binds_at_its_first_step(tmp_path: Path) -> None:
    out = run_workers(_before_init, 2, str(tmp_path / "store"))
    assert [rank for rank, _ in out] == [0, 1]
    assert all(torch.equal(a, b) for a, b in zip(out[0][1], out[1][1], strict=True))


# ---- the Python API ---------------------------------------------------------------------------


def test_the_api_says_what_it_takes() -> None:
    assert hipress.casync.register is hipress.register is register
    named = list(_model(0).named_parameters())
    with pytest.raises(TypeError, match="positional"):
        register(DDP.__new__(DDP), "onebit", "auto")  # type: ignore[misc]
    with pytest.raises(CaSyncError, match="params must be a dict"):
        CaSyncState("onebit", params=2, named_parameters=named)  # type: ignore[arg-type]
    with pytest.raises(CaSyncError, match="plan='auto'"):
        CaSyncState("onebit", named_parameters=named, plan="Auto")
    with pytest.raises(ValueError, match=r"No such file.*pass plan='auto'"):
        CaSyncState("onebit", named_parameters=named, plan="atuo")
    with pytest.raises(CaSyncError, match="holds no plan"):
        CaSyncState.plan_of({"format": "hipress.casync/1"})
    state = CaSyncState("onebit", named_parameters=named)  # no process group: binds later
    with pytest.raises(CaSyncError, match="call init_process_group"):
        state.state_dict()
    assert pickle.loads(pickle.dumps(state)).rank is None


def test_worker_log_lines_name_their_rank() -> None:
    run_workers(_log_rank, 2)


def _log_rank(rank: int, world_size: int) -> None:
    import logging

    from hipress.casync import state as state_module

    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = Keep()
    state_module.logger.addHandler(handler)
    state_module.logger.setLevel(logging.INFO)
    CaSyncState("onebit", named_parameters=_model(0).named_parameters())
    assert seen and all(m.startswith(f"[rank {rank}] casync:") for m in seen), seen


# ---- a checkpoint that lacks a rank (a peer was gone, or rank 0 saved alone) -----------------


def _partial(rank: int, world_size: int) -> tuple[list[str], int, bool, str]:
    model = _model(0)
    ddp = DDP(model, bucket_cap_mb=0.02)
    state = register(ddp, "onebit", plan=_plan(model, world_size), log_every=0)
    _train(ddp, torch.optim.SGD(model.parameters(), lr=0.05), rank, range(2))
    # what an emergency checkpoint holds after a failed collective: this rank's state only
    state.comm_error = hipress.casync.CommError("CaSync: a peer exited (test)")
    partial = state.gathered_state_dict()
    state.comm_error = None
    mine = partial["ranks"][rank]
    assert partial["missing"] == [1 - rank] and partial["ranks"][1 - rank] is None
    # each rank loads the other's partial checkpoint: its own entry is missing there
    theirs: list[dict] = [{}] * world_size
    dist.all_gather_object(theirs, partial)
    fresh = CaSyncState("onebit", named_parameters=model.named_parameters(), plan="auto",
                        log_every=0)  # fmt: skip
    fresh.load_state_dict(theirs[1 - rank])  # takes the plan and step, keeps zero states
    zero = all(bool((t == 0).all()) for s in fresh.worker_states.values()
               for t in s.tensors.values() if t.is_floating_point())  # fmt: skip
    # a stand-in saved under another configuration is refused, like any foreign state
    other = CaSyncState("onebit", named_parameters=model.named_parameters(),
                        plan=_plan(model, world_size), seed=9, log_every=0)  # fmt: skip
    with pytest.raises(CaSyncError) as info:
        other.load_state_dict(theirs[1 - rank])
    return partial["missing"], mine["rank"], zero, f"{info.value}|{fresh.plan.digest()}"


def test_a_rank_missing_from_a_gathered_checkpoint_resumes_with_its_own_states() -> None:
    for rank, (missing, own_rank, zero, text) in enumerate(run_workers(_partial, 2)):
        assert missing == [1 - rank] and own_rank == rank
        assert zero  # (the other rank's error feedback is not this rank's)
        refused, digest = text.split("|")
        assert "saved with a different options" in refused
        assert digest  # the plan came from the checkpoint
