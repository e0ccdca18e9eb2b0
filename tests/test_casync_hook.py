"""The CaSync DDP hook on real gloo groups: DDP equivalence, reference agreement through DDP
(bucket rebuild, low precision, NaN), checkpoints, config agreement and a dead peer."""

from __future__ import annotations

import copy
import io
import os
import pickle
import time
from pathlib import Path

import pytest
import torch
from casync_cases import STATEFUL, make_algorithm, single_thread
from dist_utils import run_workers
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from hipress.casync import CaSyncError, CaSyncState, ConfigMismatchError, register
from hipress.casync.reference import ReferenceSync
from hipress.codec.integrity import seal
from hipress.compll import load
from hipress.core.plan import Plan, PlanError, Strategy, TensorPlan

AG, PS, RING, AR = Strategy.ALLGATHER, Strategy.PS, Strategy.RING, Strategy.ALLREDUCE
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# "0.weight" 4096, "2.weight" 12288, "4.weight" 768 elements; biases 128, 96, 8
LAYOUT = {
    "0.weight": (RING, 2),
    "0.bias": (AR, 1),
    "2.weight": (AG, 3),
    "2.bias": (AR, 1),
    "4.weight": (PS, 1),
    "4.bias": (AR, 1),
}
NAN_STEP = 2


def _model(seed: int, dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(seed)
    net = nn.Sequential(
        nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 96), nn.ReLU(), nn.Linear(96, 8)
    )
    return net.to(dtype)


def _ddp(model: nn.Module, bucket_view: bool = False) -> DDP:
    # one bucket in the first iteration; DDP rebuilds into two after it
    return DDP(model, bucket_cap_mb=0.02, gradient_as_bucket_view=bucket_view)


def _data(rank: int, step: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(10_000 + 100 * step + rank)
    return torch.randn(16, 32, generator=gen).to(dtype), torch.randn(16, 8, generator=gen).to(dtype)


def _plan(alg_name: str, model: nn.Module, world_size: int) -> Plan:
    entries = tuple(
        TensorPlan(n, p.numel(), LAYOUT[n][0] is not AR, *LAYOUT[n])
        for n, p in model.named_parameters()
    )
    return Plan(make_algorithm(alg_name).name, {}, world_size, entries)


def _step(ddp: nn.Module, rank: int, step: int, dtype: torch.dtype) -> None:
    x, y = _data(rank, step, dtype)
    nn.functional.mse_loss(ddp(x).float(), y.float()).backward()


# ---- no compression: bit for bit DDP ------------------------------------------------------


def _uncompressed_vs_ddp(rank: int, world_size: int, steps: int) -> None:
    plain, hooked = _model(0), _model(0)
    ddp_plain, ddp_hooked = _ddp(plain), _ddp(hooked)
    state = register(ddp_hooked, algorithm=None)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (plain, hooked)]
    for step in range(steps):
        for ddp, opt in zip((ddp_plain, ddp_hooked), opts, strict=True):
            opt.zero_grad()
            _step(ddp, rank, step, torch.float32)
        for (name, a), b in zip(plain.named_parameters(), hooked.parameters(), strict=True):
            assert torch.equal(a.grad, b.grad), f"rank {rank} step {step} {name}"
        for opt in opts:
            opt.step()
    assert state.stats.last is not None and state.stats.last.buckets == 2


@pytest.mark.parametrize("world_size", [2, 4])
def test_uncompressed_equals_ddp_bit_for_bit(world_size: int) -> None:
    run_workers(_uncompressed_vs_ddp, world_size, 4)


# ---- kernels are built at register(), not in the first step ---------------------------------


def _cache_files(root: str) -> set[str]:
    return {str(p) for p in Path(root).rglob("*") if p.is_file() and not p.name.endswith(".lock")}


def _first_step_compiles_nothing(rank: int, world_size: int, root: str) -> tuple[int, int]:
    """(files in a fresh kernel cache after register, files the first step added)."""
    cache = os.path.join(root, f"rank{rank}")
    os.environ["HIPRESS_CACHE_DIR"] = cache
    model = _model(0)
    ddp = _ddp(model)
    plan = _plan("onebit", model, world_size)
    register(ddp, "onebit", plan=plan, seed=1, log_every=0)
    built = _cache_files(cache)
    _step(ddp, rank, 0, torch.float32)
    return len(built), len(_cache_files(cache) - built)


def test_kernels_are_built_at_register_and_the_first_step_compiles_nothing(tmp_path) -> None:
    for built, added in run_workers(_first_step_compiles_nothing, 2, str(tmp_path)):
        assert built > 0 and added == 0


# ---- compressed, through DDP, against the reference ------------------------------------------


def _poison(g: torch.Tensor) -> torch.Tensor:
    g = g.clone()
    g[0, 0] = float("nan")
    return g


def _through_ddp(rank: int, world_size: int, alg_name: str, dtype_name: str, steps: int,
                 device_flags: bool | None = None, bucket_view: bool = False) -> list:  # fmt: skip
    """Train a few steps with the hook; record each step's local and synced gradients.
    ``device_flags``: keep the non-finite flags as tensors, as on a GPU; ``bucket_view``:
    DDP's ``gradient_as_bucket_view`` (the gradients are views of the buckets the hook
    writes)."""
    dtype = DTYPES[dtype_name]
    model = _model(0, dtype)
    replica = copy.deepcopy(model)
    ddp = _ddp(model, bucket_view)
    state = register(ddp, make_algorithm(alg_name), plan=_plan(alg_name, model, world_size), seed=3)
    state._rt.ctx.device_flags = device_flags
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    records = []
    for step in range(steps):
        handles = []
        # one NaN in one rank's gradient of the ring tensor and of an allgather tensor, and in
        # another's of a PS tensor
        if step == NAN_STEP and rank in (0, world_size - 1):
            layers = (0, 2) if rank == 0 else (4,)
            handles = [m[x].weight.register_hook(_poison) for m in (model, replica) for x in layers]
        replica.load_state_dict(model.state_dict())
        replica.zero_grad()
        _step(replica, rank, step, dtype)
        local = {n: p.grad.clone() for n, p in replica.named_parameters()}
        opt.zero_grad()
        _step(ddp, rank, step, dtype)
        synced = {n: p.grad.clone() for n, p in model.named_parameters()}
        for h in handles:
            h.remove()
        if all(bool(g.isfinite().all()) for g in synced.values()):
            opt.step()  # like GradScaler: skip steps with non-finite gradients
        records.append((local, synced, state.stats.last))
    return records


def _check_against_reference(
    world_size: int, alg_name: str, dtype_name: str, results: list
) -> None:
    dtype = DTYPES[dtype_name]
    plan = _plan(alg_name, _model(0), world_size)
    ref = ReferenceSync(make_algorithm(alg_name), plan, world_size, seed=3)
    for step in range(len(results[0])):
        with single_thread():
            expected = ref.step([results[r][step][0] for r in range(world_size)])
        for rank in range(world_size):
            synced = results[rank][step][1]
            for name, (strategy, k) in LAYOUT.items():
                got, want = synced[name].reshape(-1), expected[name]
                where = f"rank {rank} step {step} {name} ({strategy.value}, K={k})"
                assert got.dtype == dtype, where
                if strategy is AR:
                    tol = world_size * torch.finfo(dtype).eps
                    torch.testing.assert_close(
                        got, want, rtol=tol, atol=tol * float(want.abs().max()), msg=where
                    )
                else:
                    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True, msg=where)
        # the NaNs reached every rank, and only the partitions that held them
        if step == NAN_STEP:
            for rank in range(world_size):
                synced = results[rank][step][1]
                g = synced["0.weight"].reshape(-1)
                half = g.numel() // 2
                assert g[:half].isnan().all() and g[half:].isfinite().all(), f"rank {rank}"
                g = synced["2.weight"].reshape(-1)  # allgather, 3 partitions
                third = g.numel() // 3
                assert g[:third].isnan().all() and g[third:].isfinite().all(), f"rank {rank}"
                assert synced["4.weight"].isnan().all(), f"rank {rank}"
                for name in ("0.bias", "2.bias", "4.bias"):
                    assert synced[name].isfinite().all(), f"rank {rank} {name}"
    # DDP used one bucket, then rebuilt into two: state keyed by parameter survived it
    assert [results[0][s][2].buckets for s in range(len(results[0]))][:2] == [1, 2]


def _ddp_cases() -> list[tuple[int, str, str]]:
    # every algorithm runs every strategy in test_casync_strategies; here the integration
    return [(2, a, "float32") for a in STATEFUL] + [
        (4, "onebit", "float32"),
        (4, "terngrad", "float32"),
        (2, "terngrad", "float16"),
        (2, "dgc", "bfloat16"),
    ]


@pytest.mark.parametrize("case", _ddp_cases(), ids=lambda c: f"N{c[0]}-{c[1]}-{c[2]}")
def test_ddp_matches_reference(case: tuple[int, str, str]) -> None:
    world_size, alg_name, dtype_name = case
    results = run_workers(_through_ddp, world_size, alg_name, dtype_name, 4)
    _check_against_reference(world_size, alg_name, dtype_name, results)


@pytest.mark.parametrize(
    "case", [(2, "onebit", "float32"), (4, "dgc", "float32"), (2, "int8", "float16")],
    ids=lambda c: f"N{c[0]}-{c[1]}-{c[2]}",
)  # fmt: skip
def test_flags_kept_on_the_device_give_the_same_gradients(case: tuple[int, str, str]) -> None:
    """The path CUDA buckets take: non-finite flags as tensors, every decision (NaN fills,
    state resets) a tensor operation; the same gradients as the reference, NaN step included.
    (int8's encode does not report NaN/Inf: its chunks are read for it.)"""
    world_size, alg_name, dtype_name = case
    results = run_workers(_through_ddp, world_size, alg_name, dtype_name, 4, True)
    _check_against_reference(world_size, alg_name, dtype_name, results)


@pytest.mark.parametrize(
    "case", [(2, "onebit", "float32"), (4, "dgc", "float32")],
    ids=lambda c: f"N{c[0]}-{c[1]}-{c[2]}",
)  # fmt: skip
def test_gradients_as_bucket_views_give_the_same_gradients(case: tuple[int, str, str]) -> None:
    """DDP(gradient_as_bucket_view=True), which saves a copy of every gradient each step:
    the hook's result lands in the gradients all the same."""
    world_size, alg_name, dtype_name = case
    results = run_workers(_through_ddp, world_size, alg_name, dtype_name, 4, None, True)
    _check_against_reference(world_size, alg_name, dtype_name, results)


# ---- checkpoints ------------------------------------------------------------------------------


def _train(ddp: nn.Module, opt: torch.optim.Optimizer, rank: int, steps: range) -> None:
    for step in steps:
        opt.zero_grad()
        _step(ddp, rank, step, torch.float32)
        opt.step()


def _resume(rank: int, world_size: int, alg_name: str) -> None:
    def build(seed: int) -> tuple[nn.Module, DDP, CaSyncState, torch.optim.Optimizer]:
        model = _model(seed)
        ddp = _ddp(model)
        state = register(ddp, make_algorithm(alg_name), plan=_plan(alg_name, model, world_size))
        # (dgc applies momentum itself: register refuses it with SGD's momentum on top)
        momentum = 0.0 if alg_name == "dgc" else 0.9
        return model, ddp, state, torch.optim.SGD(model.parameters(), lr=0.05, momentum=momentum)

    model, ddp, _, opt = build(0)
    _train(ddp, opt, rank, range(6))
    straight = [p.detach().clone() for p in model.parameters()]

    model, ddp, state, opt = build(0)
    _train(ddp, opt, rank, range(3))
    blob = io.BytesIO()
    torch.save(
        {"model": model.state_dict(), "opt": opt.state_dict(), "casync": state.state_dict()}, blob
    )

    for load_casync in (True, False):
        blob.seek(0)
        ckpt = torch.load(blob)
        model, ddp, state, opt = build(1)  # other initial weights: the checkpoint must win
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        if load_casync:
            state.load_state_dict(ckpt["casync"])
        _train(ddp, opt, rank, range(3, 6))
        same = all(torch.equal(a, b) for a, b in zip(straight, model.parameters(), strict=True))
        # resuming with the state is exact; without it, error feedback / RNG counters differ
        assert same == load_casync, f"rank {rank}: load_casync={load_casync} same={same}"


@pytest.mark.parametrize("alg_name", STATEFUL)
def test_state_dict_resume_is_exact(alg_name: str) -> None:
    run_workers(_resume, 2, alg_name)


def _pickle_and_validate(rank: int, world_size: int) -> None:
    model = _model(0)
    ddp = _ddp(model)
    plan = _plan("terngrad", model, world_size)
    state = register(ddp, "terngrad", params={"bitwidth": 4}, plan=plan)
    _step(ddp, rank, 0, torch.float32)
    clone = pickle.loads(pickle.dumps(state))
    assert clone.process_group is None and clone.plan == state.plan
    assert clone.algorithm.digest == state.algorithm.digest  # reloaded from name and params
    for k, s in state.worker_states.items():
        assert s.step == clone.worker_states[k].step == 1
    with pytest.raises(CaSyncError, match="does not know"):
        clone.names_of(list(model.parameters()))
    clone.bind(model.named_parameters())
    assert clone.names_of([model[0].weight]) == ["0.weight"]

    # a checkpoint of another rank is refused
    sd = state.state_dict()
    sd["rank"] = 1 - rank
    with pytest.raises(CaSyncError, match="load each rank's own"):
        state.load_state_dict(seal(sd))  # (sealed again: the digest would refuse it first)
    # a damaged checkpoint is refused whole, naming the rank and the entry; nothing changes
    before = {k: s.state_dict() for k, s in state.worker_states.items()}
    sd = state.state_dict()
    first, last = sorted(sd["worker"])[0], sorted(sd["worker"])[-1]
    sd["worker"][first]["step"] = 7
    sd["worker"][last]["tensors"] = {"e": torch.zeros(3)}  # terngrad keeps no tensors
    with pytest.raises(CaSyncError, match=rf"rank {rank}: state `{last}`: state entries do not"):
        state.load_state_dict(seal(sd))
    assert state.worker_states[first].step == before[first]["step"] == 1
    with pytest.raises(CaSyncError, match="`step` must be an integer >= 0, got -2"):
        state.load_state_dict(seal({**state.state_dict(), "step": -2}))
    with pytest.raises(CaSyncError, match=f"rank {rank}: damaged CaSync state dict: no worker"):
        state.load_state_dict(seal({k: v for k, v in state.state_dict().items() if k != "worker"}))
    # options say what they take
    for kwargs, msg in [
        ({"seed": -1}, "seed must be an integer >= 0, got -1"),
        ({"log_every": "10"}, "log_every must be an integer >= 0"),
        ({"check_finite": 1}, "check_finite must be True or False"),
        ({"plan": "AUTO"}, "plan='auto'"),
        ({"plan": 3}, "plan must be .default. .or None: the default rule., .auto."),
        ({"plan": "Default"}, "did you mean plan=.default."),
        ({"params_schedule": "0:0.1"}, "params_schedule must be a list of"),
        ({"params": 2}, "params must be a dict"),
    ]:
        with pytest.raises(CaSyncError, match=msg):
            CaSyncState("terngrad", named_parameters=model.named_parameters(), **kwargs)
    # plans and algorithms that do not fit are refused before training
    wrong_world = Plan(plan.algorithm, {}, world_size + 1, plan.entries)
    with pytest.raises(PlanError, match="workers"):
        register(_ddp(_model(0)), "terngrad", plan=wrong_world)
    tiny = tuple(
        TensorPlan(e.name, e.numel, True, PS, e.numel) if e.name == "4.bias" else e
        for e in plan.entries
    )
    with pytest.raises(PlanError, match=r"4\.bias"):
        register(_ddp(_model(0)), "terngrad", plan=Plan(plan.algorithm, {}, 2, tiny))
    with pytest.raises(PlanError, match="algorithm 'terngrad'"):
        register(_ddp(_model(0)), "onebit", plan=plan)
    with pytest.raises(CaSyncError, match="bitwidth"):
        register(_ddp(_model(0)), "terngrad", params={"bitwidth": 3})
    with pytest.raises(CaSyncError, match="no_such_algorithm"):
        register(_ddp(_model(0)), "no_such_algorithm")
    with pytest.raises(CaSyncError, match="DistributedDataParallel"):
        register(_model(0), "terngrad")


def test_pickle_and_validation() -> None:
    run_workers(_pickle_and_validate, 2)


# ---- agreement and failures -------------------------------------------------------------------


def _disagree(rank: int, world_size: int, what: str) -> str:
    model = _model(0)
    ddp = _ddp(model)
    name, params, seed = "terngrad", {"bitwidth": 2}, 0
    plan = _plan(name, model, world_size)
    if rank == 1:
        if what == "algorithm":
            name = "onebit"
            plan = Plan(name, {}, world_size, plan.entries)
        elif what == "params":
            params = {"bitwidth": 4}
        elif what == "plan":
            plan = Plan(
                plan.algorithm,
                {},
                world_size,
                tuple(
                    TensorPlan(e.name, e.numel, True, AG, 1) if e.name == "2.weight" else e
                    for e in plan.entries
                ),
            )
        else:
            seed = 1
    register(ddp, name, params=params if name == "terngrad" else None, plan=plan, seed=seed)
    with pytest.raises(Exception) as info:
        _step(ddp, rank, 0, torch.float32)
    return f"{type(info.value).__name__}: {info.value}"


@pytest.mark.parametrize("what", ["algorithm", "params", "plan", "seed"])
def test_disagreeing_ranks_get_a_clear_error(what: str) -> None:
    messages = run_workers(_disagree, 2, what, timeout=60)
    key = {"algorithm": "algorithm", "params": "algorithm", "plan": "plan", "seed": "options"}[what]
    for rank, msg in enumerate(messages):
        assert "ranks disagree on" in msg and key in msg, f"rank {rank}: {msg}"
        assert "rank 0:" in msg and "rank 1:" in msg, msg
    assert issubclass(ConfigMismatchError, CaSyncError)


def _dead_peer(rank: int, world_size: int, how: str, pg_timeout: float) -> tuple | None:
    model = _model(0)
    ddp = _ddp(model)
    plan = _plan("terngrad", model, world_size)
    if how.startswith("ring-"):  # every tensor on the ring: no collective is left to fail
        how = how.removeprefix("ring-")
        plan = Plan(plan.algorithm, {}, world_size, tuple(
            TensorPlan(e.name, e.numel, True, RING, 1) for e in plan.entries
        ))  # fmt: skip
    warm = how.startswith("warmup-")  # still in the uncompressed warm-up steps
    how = how.removeprefix("warmup-")
    register(ddp, "terngrad", plan=plan, warmup_steps=10 if warm else 0)
    first = 0 if how == "first" else 2  # "first": gone before the first step's config check
    for step in range(first):
        _step(ddp, rank, step, torch.float32)
    if rank == world_size - 1:
        if how == "stall":  # alive but silent past the timeout
            time.sleep(pg_timeout + 5)
        os._exit(0)  # gone without a word
    t = time.monotonic()
    with pytest.raises(CaSyncError) as info:
        _step(ddp, rank, first, torch.float32)
    return time.monotonic() - t, f"{type(info.value).__name__}: {info.value}"


@pytest.mark.parametrize(
    "how", ["exit", "stall", "first", "ring-exit", "ring-stall", "warmup-exit", "warmup-stall"]
)
def test_dead_peer_fails_the_step_within_the_timeout(how: str) -> None:
    pg_timeout = 4.0
    results = run_workers(_dead_peer, 3, how, pg_timeout, pg_timeout=pg_timeout, timeout=60)
    assert results[2] is None
    for elapsed, msg in results[:2]:
        assert elapsed < pg_timeout + 4, (elapsed, msg)
        assert msg.startswith("CommError: CaSync: ") and "peer may have exited" in msg, msg


class _Broken:
    """An algorithm whose decode fails on this rank (a corrupt kernel library, say)."""

    def __init__(self) -> None:
        from hipress.compll import load

        self._alg = load("onebit", backend="reference")
        self.name, self.params, self.digest = "broken", {}, "broken"

    def payload_nbytes(self, n: int) -> int:
        return self._alg.payload_nbytes(n)

    def init_state(self, n: int, device=None, seed: int = 0, tensor_id: int = 0):  # type: ignore[no-untyped-def]
        return self._alg.init_state(n, device, seed, tensor_id)

    def encode(self, grad, state, out=None):  # type: ignore[no-untyped-def]
        return self._alg.encode(grad, state, out)

    def decode(self, payload, n, out=None, accumulate=False):  # type: ignore[no-untyped-def]
        raise OSError("libkernel.so: invalid ELF header")


def _local_failure(rank: int, world_size: int) -> str:
    model = _model(0)
    ddp = _ddp(model)
    plan = Plan("broken", {}, world_size, tuple(
        TensorPlan(n, p.numel(), True, AG, 1) for n, p in model.named_parameters()
    ))  # fmt: skip
    register(ddp, _Broken(), plan=plan)
    with pytest.raises(CaSyncError) as info:
        _step(ddp, rank, 0, torch.float32)
    return f"{type(info.value).__name__}: {info.value}"


def test_a_local_failure_is_not_reported_as_the_network() -> None:
    for msg in run_workers(_local_failure, 2, timeout=60):
        assert msg.startswith("CaSyncError: CaSync: decoding failed on this rank (OSError: "
                              "libkernel.so: invalid ELF header)"), msg  # fmt: skip


# ---- SeCoPa plans -----------------------------------------------------------------------------


def _auto(rank: int, world_size: int) -> str:
    model = _model(0)
    ddp = _ddp(model)
    state = register(ddp, "terngrad", plan="auto")
    for step in range(2):
        _step(ddp, rank, step, torch.float32)
    assert state.stats.last is not None
    return state.plan.digest()


def test_auto_plan_from_secopa_is_shared_by_every_rank() -> None:
    digests = run_workers(_auto, 2, timeout=120)
    assert digests[0] == digests[1]


# ---- warm-up: the first steps uncompressed, states untouched ----------------------------------


def _residuals_zero(state: CaSyncState) -> bool:
    return all(
        bool((t == 0).all()) for s in state.worker_states.values() for t in s.tensors.values()
    )


def _warmup(rank: int, world_size: int) -> tuple[list[tuple[bool, bool, bool]], int, bool]:
    plain, hooked = _model(0), _model(0)
    ddp_plain, ddp_hooked = _ddp(plain), _ddp(hooked)
    plan = _plan("onebit", hooked, world_size)
    state = register(ddp_hooked, make_algorithm("onebit"), plan=plan, warmup_steps=2)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (plain, hooked)]
    seen = []
    for step in range(4):
        for ddp, opt in zip((ddp_plain, ddp_hooked), opts, strict=True):
            opt.zero_grad()
            _step(ddp, rank, step, torch.float32)
        same = all(
            torch.equal(a.grad, b.grad)
            for a, b in zip(plain.parameters(), hooked.parameters(), strict=True)
        )
        last = state.stats.last
        assert last is not None
        seen.append((same, last.bytes_sent < last.bytes_uncompressed, _residuals_zero(state)))
        for opt in opts:
            opt.step()
    sd = state.state_dict()
    # a resumed state continues after the warm-up: its next step is compressed
    ddp_again = _ddp(_model(0))
    state2 = register(ddp_again, make_algorithm("onebit"), plan=plan, warmup_steps=2)
    state2.load_state_dict(sd)
    _step(ddp_again, rank, 4, torch.float32)
    last2 = state2.stats.last
    assert last2 is not None
    return seen, sd["step"], last2.bytes_sent < last2.bytes_uncompressed


def test_warmup_steps_are_ddp_allreduce_then_compression_starts() -> None:
    for seen, step, resumed in run_workers(_warmup, 2):
        # steps 0-1: DDP's allreduce bit for bit, nothing compressed, error feedback untouched
        assert seen[:2] == [(True, False, True)] * 2
        # steps 2-3: compressed, different from DDP, residuals in use
        assert all(not same and compressed and not zero for same, compressed, zero in seen[2:])
        assert step == 4 and resumed


def test_warmup_steps_are_validated() -> None:
    with pytest.raises(CaSyncError, match="warmup_steps"):
        CaSyncState(None, named_parameters=[("w", 4)], warmup_steps=-1)


# ---- changing the algorithm's parameters between steps ------------------------------------

SPARSE = [("w", 5000, PS, 2), ("v", 3000, RING, 1), ("u", 2000, AG, 1)]


def _sparse_plan(world_size: int) -> Plan:
    entries = tuple(TensorPlan(n, k, True, s, p) for n, k, s, p in SPARSE)
    return Plan("dgc", {}, world_size, entries)


def _sparse_grads(rank: int, step: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(500 * step + rank)
    return {n: torch.randn(k, generator=gen) for n, k, _, _ in SPARSE}


def _scheduled(rank: int, world_size: int, schedule: list) -> tuple[list, dict]:
    named = [(n, k) for n, k, _, _ in SPARSE]
    plan = _sparse_plan(world_size)
    state = CaSyncState("dgc", named_parameters=named, plan=plan, seed=5, params_schedule=schedule)
    out, resumed = [], {}
    for step in range(4):
        grads = _sparse_grads(rank, step)
        buf = torch.cat([grads[n] for n, *_ in SPARSE])
        params = dict(state.plan.params)  # in force for this step
        flat = state.submit(buf, [n for n, *_ in SPARSE], last=True).wait()
        out.append((flat.clone(), state.stats.last.bytes_sent, params))
        if step == 1:  # a checkpoint after step 1 resumes with step 2's parameters
            again = CaSyncState(
                "dgc", named_parameters=named, plan=plan, seed=5, params_schedule=schedule
            )
            again.load_state_dict(state.state_dict())
            resumed = dict(again.plan.params)
    return out, resumed


def test_params_schedule_changes_the_algorithm_and_keeps_its_states() -> None:
    world_size = 2
    schedule = [(2, {"s_percent": 0.05})]  # DGC's warm-up, backwards: denser later
    results = run_workers(_scheduled, world_size, schedule)
    ref = ReferenceSync(make_algorithm("dgc"), _sparse_plan(world_size), world_size, seed=5)
    for step in range(4):
        if step == 2:  # the same states, now encoded by the denser algorithm
            ref.algorithm = load("dgc", s_percent=0.05)
        with single_thread():
            want = ref.step([_sparse_grads(r, step) for r in range(world_size)])
        want_flat = torch.cat([want[n] for n, *_ in SPARSE])
        for rank in range(world_size):
            got, _, params = results[rank][0][step]
            assert torch.equal(got, want_flat), f"rank {rank} step {step}"
            assert params.get("s_percent", 0.001) == (0.05 if step >= 2 else 0.001)
    # 50x the elements: far more bytes once the new parameters are in force
    sends = [sent for _, sent, _ in results[0][0]]
    assert min(sends[2:]) > 10 * max(sends[:2])
    assert results[0][1]["s_percent"] == 0.05


def _schedule_error(rank: int, world_size: int, by_name: bool, schedule: list) -> str:
    alg = "dgc" if by_name else make_algorithm("dgc")
    with pytest.raises(CaSyncError) as info:
        CaSyncState(alg, named_parameters=[("w", 64)], params_schedule=schedule)
    return str(info.value)


@pytest.mark.parametrize(
    ("by_name", "schedule", "match"),
    [
        (False, [(1, {"s_percent": 0.01})], "given by name"),
        (True, [(5, {"s_percent": 0.01}), (2, {"s_percent": 0.1})], "ascending"),
        (True, [(-1, {"s_percent": 0.01})], "ascending"),
        (True, [(3, {"s_percent": 7.0})], "s_percent"),
    ],
)
def test_a_bad_params_schedule_is_refused(by_name: bool, schedule: list, match: str) -> None:
    (msg,) = run_workers(_schedule_error, 1, by_name, schedule)
    assert match in msg, msg
