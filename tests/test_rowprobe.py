"""Embeddings kept plain by the default rule travel as rows without a probe of the user's own
(:mod:`hipress.casync.rowprobe`): real gloo groups, gradients against DDP's allreduce, the
decision agreed across ranks, an explicit plan left as it is."""

from __future__ import annotations

import torch
from dist_utils import run_workers
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from hipress.casync import register
from hipress.casync.rowprobe import RowProbe

ROWS, DIM = 4096, 16


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(ROWS, DIM)
        self.out = nn.Linear(DIM, 4)

    def forward(self, tok: torch.Tensor) -> torch.Tensor:
        return self.out(self.emb(tok))


def _tokens(step: int, rank: int) -> torch.Tensor:
    """Rank 1 touches more rows than rank 0 (the bound follows the larger count); step 3 is
    denser than any bound on rank 0 (that step falls back to dense)."""
    n = 600 if step == 3 and rank == 0 else 4 + 4 * rank
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randint(0, ROWS, (1, n), generator=g)


def _run(rank: int, n: int, plan: object) -> dict[str, object]:
    ref, mine = _Net(), _Net()
    ref_ddp, ddp = DDP(ref), DDP(mine)
    state = register(ddp, "onebit", plan=plan, log_every=0)
    same = []
    bounds = []
    for step in range(5):
        grads = []
        for model, wrapped in ((ref, ref_ddp), (mine, ddp)):
            model.zero_grad()
            wrapped(_tokens(step, rank)).square().sum().backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        same.append(all(torch.allclose(a, b, rtol=1e-6, atol=1e-7)
                        for a, b in zip(*grads, strict=True)))  # fmt: skip
        bounds.append({e.name: e.row_bound for e in state.plan.entries}["emb.weight"])
    return {"same": same, "bounds": bounds}


def _default(rank: int, n: int) -> dict[str, object]:
    return _run(rank, n, None)


def _explicit(rank: int, n: int) -> dict[str, object]:
    from hipress.core.plan import Plan, Strategy, TensorPlan

    plan = Plan("onebit", {}, n, (
        TensorPlan("emb.weight", ROWS * DIM, False, Strategy.ALLREDUCE),
        TensorPlan("out.weight", DIM * 4, False, Strategy.ALLREDUCE),
        TensorPlan("out.bias", 4, False, Strategy.ALLREDUCE),
    ))  # fmt: skip
    return _run(rank, n, plan)


def test_the_default_rule_sends_embeddings_as_rows_after_one_step_exactly() -> None:
    for n in (2, 4):
        results = run_workers(_default, n)
        for r in results:
            assert r["same"] == [True] * 5, r  # DDP's gradients at every step, dense step too
            # step 0 dense (counted), then rows with the bound of the busiest rank:
            # ceil(2 * (4 + 4 * (n - 1))) + 1 rows at most
            assert r["bounds"][0] == 0 and len(set(r["bounds"][1:])) == 1, r
            assert r["bounds"][1] == 2 * (4 + 4 * (n - 1)) + 1, r
        assert len({tuple(r["bounds"]) for r in results}) == 1


def test_an_explicit_plan_is_run_as_it_is() -> None:
    for r in run_workers(_explicit, 2):
        assert r["same"] == [True] * 5 and r["bounds"] == [0] * 5, r


def test_only_the_default_rule_and_auto_probe() -> None:
    assert RowProbe.of(None, 0).enabled and RowProbe.of("auto", 2).at_step == 3
    assert not RowProbe.of("plan.json", 0).enabled


def _auto(rank: int, n: int) -> dict[str, object]:
    ref, mine = _Net(), _Net()
    ref_ddp, ddp = DDP(ref), DDP(mine)
    state = register(ddp, "onebit", plan="auto", log_every=0)
    same, prices, bounds = [], [], []
    for step in range(3):
        grads = []
        for model, wrapped in ((ref, ref_ddp), (mine, ddp)):
            model.zero_grad()
            wrapped(_tokens(step, rank)).square().sum().backward()
            grads.append(model.emb.weight.grad.clone())  # (the rest may be compressed)
        same.append(torch.allclose(*grads, rtol=1e-6, atol=1e-7))
        prices.append(dict(state.plan.meta["row_prices"]["emb.weight"]))
        bounds.append({e.name: e.row_bound for e in state.plan.entries}["emb.weight"])
    return {"same": same, "prices": prices, "bounds": bounds}


def test_auto_plans_price_the_embedding_and_casync_decides_by_the_breakeven() -> None:
    results = run_workers(_auto, 2)
    for r in results:
        assert r["same"] == [True] * 3, r
        first, later = r["prices"][0], r["prices"][-1]
        # SeCoPa's plan holds the break-even count (exact rows against a plain allreduce on
        # this machine's measured link: a 256 KB embedding may well be cheaper dense)
        assert isinstance(first["breakeven"], int) and not first["compressed"], r
        assert "touched" not in first
        # one step counted (at most 8 rows, on rank 1), then the break-even decides
        rows = first["breakeven"] >= 8
        assert later["touched"] == 8 and later["chosen"] == ("rows" if rows else "dense"), r
        assert r["bounds"] == ([0, 17, 17] if rows else [0, 0, 0]), r
    assert len({str(r["prices"]) for r in results}) == 1  # the same plan on every rank
