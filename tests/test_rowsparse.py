"""Row-sparse synchronisation on real gloo groups: a plain ``nn.Embedding`` sharing a DDP bucket
with a dense layer, exact against DDP's allreduce (rows repeated across ranks, a step denser
than the bound, steps where some or every rank touches no row), error feedback in compressed
mode, and a checkpoint resumed bit-exact."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from dist_utils import run_workers
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from hipress.casync import register
from hipress.casync.rowsparse import plan_rows, touched_rows
from hipress.codec.rowsparse import row_state_key
from hipress.core.plan import Plan, PlanError, Strategy, TensorPlan

ROWS, DIM, BOUND = 64, 8, 6


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(ROWS, DIM)
        self.out = nn.Linear(DIM, 4)

    def forward(self, tok: torch.Tensor, scale: float) -> torch.Tensor:
        if scale == 0:  # no row touched: the gradient is +0.0 everywhere
            return self.out(torch.zeros(*tok.shape, DIM)) + self.emb.weight[:0].sum()
        return self.out(self.emb(tok) * scale)


def _batch(step: int, rank: int) -> tuple[torch.Tensor, float]:
    """Tokens of ``rank`` at ``step``: rows shared by every rank (3, 5) and rank's own; step 2 is
    denser than the bound on rank 0; step 3 touches no row on rank 1; step 4 on no rank."""
    tok = torch.tensor([[3, 5, 10 + rank, 10 + 2 * rank]])
    if step == 2 and rank == 0:
        tok = torch.arange(20).view(2, 10)
    scale = 0.0 if step == 4 or (step == 3 and rank == 1) else 1.0
    return tok, scale


def _plan(algorithm: str, compress: bool) -> Plan:
    s = Strategy.ALLGATHER if compress else Strategy.ALLREDUCE
    return Plan(algorithm, {}, 0, (
        TensorPlan("emb.weight", ROWS * DIM, compress, s, rows=ROWS, row_bound=BOUND),
        TensorPlan("out.weight", DIM * 4, False, Strategy.ALLREDUCE),
        TensorPlan("out.bias", 4, False, Strategy.ALLREDUCE),
    ))  # fmt: skip


def _with_world(plan: Plan, n: int) -> Plan:
    return Plan(plan.algorithm, plan.params, n, plan.entries)


def _grads(model: nn.Module, ddp: nn.Module, step: int, rank: int) -> list[torch.Tensor]:
    model.zero_grad()
    tok, scale = _batch(step, rank)
    ddp(tok, scale).square().sum().backward()
    return [p.grad.clone() for p in model.parameters()]


def _exact(rank: int, n: int) -> list[tuple[int, bool]]:
    ref, mine = _Net(), _Net()
    ref_ddp = DDP(ref)
    ddp = DDP(mine)
    state = register(ddp, "onebit", plan=_with_world(_plan("onebit", False), n), log_every=0)
    out = []
    for step in range(5):
        want, got = _grads(ref, ref_ddp, step, rank), _grads(mine, ddp, step, rank)
        same = all(torch.equal(a, b) for a, b in zip(want, got, strict=True))
        close = all(
            torch.allclose(a, b, rtol=1e-6, atol=1e-7) for a, b in zip(want, got, strict=True)
        )
        out.append((step, same if n == 2 else close))
    assert state.stats is not None
    return out


@pytest.mark.parametrize("n", [2, 4])
def test_exact_equals_ddp_allreduce(n: int) -> None:
    for results in run_workers(_exact, n):
        assert results == [(s, True) for s in range(5)]


def _feedback(rank: int, n: int, algorithm: str, params: dict) -> tuple[float, float]:
    """Sum over steps of the synced gradients plus the ranks' mean residual, against the sum
    of the true mean gradients (error feedback keeps it)."""
    ref, mine = _Net(), _Net()
    ddp = DDP(mine)
    state = register(ddp, algorithm, params=params, plan=_with_world(_plan(algorithm, True), n),
                     log_every=0)  # fmt: skip
    synced = torch.zeros(ROWS, DIM)
    true = torch.zeros(ROWS, DIM)
    for step in range(5):
        synced += _grads(mine, ddp, step, rank)[0]
        g = _grads(ref, ref, step, rank)[0]
        dist.all_reduce(g)
        true += g / n
    res = state.worker_states[row_state_key("emb.weight")].tensors["residual"].clone()
    dist.all_reduce(res)
    err = (synced + res.view(ROWS, DIM) / n - true).abs().max().item()
    return err, res.abs().max().item()


def test_error_feedback_keeps_the_sum() -> None:
    for err, res in run_workers(_feedback, 2, "topk", {"ratio": 0.25}):
        assert err < 1e-5
        assert res > 1e-3  # topk left something out: the residual holds it


def _resume(rank: int, n: int, path: str) -> bool:
    plan = _with_world(_plan("onebit", True), n)

    def run(steps: range, sd: dict | None) -> tuple[list[torch.Tensor], dict]:
        model = _Net()
        ddp = DDP(model)
        state = register(ddp, "onebit", plan=plan, log_every=0)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        if sd is not None:
            model.load_state_dict(sd["model"])
            state.load_state_dict(sd["casync"])
        for step in steps:
            _grads(model, ddp, step, rank)
            opt.step()
        return [p.detach().clone() for p in model.parameters()], {
            "model": model.state_dict(),
            "casync": state.state_dict(),
        }

    whole, _ = run(range(5), None)
    _, half = run(range(2), None)
    torch.save(half, f"{path}-{rank}")
    resumed, _ = run(range(2, 5), torch.load(f"{path}-{rank}", weights_only=False))
    return all(torch.equal(a, b) for a, b in zip(whole, resumed, strict=True))


def test_checkpoint_resumes_bit_exact(tmp_path) -> None:
    assert run_workers(_resume, 2, str(tmp_path / "ck")) == [True, True]


def test_plan_rows_and_plan_file() -> None:
    model = _Net()
    model(torch.tensor([[1, 2, 3]]), 1.0).sum().backward()
    measured = touched_rows(model.named_parameters())
    assert measured["emb.weight"] == (ROWS, 3)
    base = _with_world(_plan("onebit", False), 2)
    dense = Plan("onebit", {}, 2, tuple(TensorPlan(e.name, e.numel, e.compress, e.strategy)
                                        for e in base.entries))  # fmt: skip
    planned = plan_rows(dense, measured, 2)
    e = planned.lookup("emb.weight")
    assert (e.rows, e.row_bound, e.compress) == (ROWS, 7, False)
    assert planned.lookup("out.weight").row_bound == 0  # 4 rows of 8, all touched: dense
    again = Plan.from_json(planned.to_json())
    assert again.digest() == planned.digest() != dense.digest()
    assert "row_bound" not in dense.to_json()  # dense entries are written as before
    with pytest.raises(PlanError, match="row_bound"):
        TensorPlan("x", 12, False, Strategy.ALLREDUCE, rows=5, row_bound=2)
    with pytest.raises(PlanError, match="no entry"):
        plan_rows(dense, {"nope": (4, 1)}, 2)


def _probe(rank: int, n: int) -> tuple[int, int, bool]:
    from hipress.casync.rowsparse import probe_plan

    model = _Net()
    steps = [lambda m, s=s: m(*_batch(s, rank)).square().sum().backward() for s in (0, 1)]
    plan = probe_plan(model, steps, "onebit", max_fraction=0.5)  # (2 x 9 of 64 rows)
    e = plan.lookup("emb.weight")
    return e.rows, e.row_bound, all(p.grad.eq(0).all() for p in model.parameters())


def test_probe_plan_agrees_on_the_largest_count() -> None:
    # each rank touches 4 distinct rows per step: the bound is 2 * 4 + 1 on both
    assert run_workers(_probe, 2) == [(ROWS, 9, True), (ROWS, 9, True)]


def test_a_dense_embedding_stays_plain_and_the_log_says_how_to_compress_it() -> None:
    from hipress.codec.rowplan import decide_rows

    plan = Plan("onebit", {}, 2, (TensorPlan("tok.weight", 1024 * 8, False, Strategy.ALLREDUCE),),
                meta={"kept_plain": {"tok.weight": "embedding"}})  # fmt: skip
    new, chosen, lines = decide_rows(plan, {"tok.weight": (1024, 1024)}, 2)
    assert chosen == [] and not new.entries[0].compress and not new.entries[0].row_bound
    assert "dense gradient" in lines[0] and "include=['tok.weight']" in lines[0]
    _, _, sparse = decide_rows(plan, {"tok.weight": (1024, 3)}, 2)
    assert "dense gradient" not in sparse[0]
