"""Embeddings decided as rows over real Horovod (``hipress.horovod.rowprobe``).

This file is also the worker: ``horovodrun -np N --gloo python tests/test_horovod_rows.py
CHECK...`` runs the checks named; each test asserts its check passed on every rank. The model
has a token embedding of which a step touches a few rows (rows pay), a position embedding of
which every step touches every row (they do not) and a small dense head.

Two ranks run every check in one launch. The same exactness check on four ranks costs a
second launch (about as long again on two cores), so it runs only with
``HIPRESS_HOROVOD_4_RANKS=1``.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from typing import Any

import pytest
import torch
from horovod_launch import assert_checked, launch, needs_horovod
from torch import nn

VOCAB, POS, DIM, STEPS = 32768, 8, 64, 6
DENSE_STEP, EMPTY_STEP = 3, 4  # rank 0 touches 300 rows / no rank touches a token row


TWO = ["auto", "default", "resume"]
FOUR = ["default"]


@pytest.fixture(scope="module")
def two() -> str:
    return launch(2, __file__, *TWO)


@pytest.fixture(scope="module")
def four() -> str:
    return launch(4, __file__, *FOUR)


@needs_horovod
@pytest.mark.timeout(300)
@pytest.mark.parametrize("check", TWO)
def test_two_ranks(two: str, check: str) -> None:
    assert_checked(two, check, 2)


@needs_horovod
@pytest.mark.skipif(not os.environ.get("HIPRESS_HOROVOD_4_RANKS"),
                    reason="four Horovod ranks: set HIPRESS_HOROVOD_4_RANKS=1")  # fmt: skip
@pytest.mark.timeout(300)
@pytest.mark.parametrize("check", FOUR)
def test_four_ranks(four: str, check: str) -> None:
    assert_checked(four, check, 4)


# ---- the worker (under horovodrun) ---------------------------------------------------------


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.tok_emb = nn.Embedding(VOCAB, DIM)
        self.pos_emb = nn.Embedding(POS, DIM)
        self.head = nn.Linear(DIM, 4)

    def forward(self, tok: torch.Tensor) -> torch.Tensor:
        pos = self.pos_emb(torch.arange(POS)).unsqueeze(0)
        x = self.tok_emb(tok) if tok.numel() else torch.zeros(1, POS, DIM)
        return self.head(torch.tanh(x + pos))


def tokens(step: int, rank: int) -> torch.Tensor:
    """A few rows per rank and step, one of them shared by every rank; more than any bound
    on rank 0 at DENSE_STEP; none on any rank at EMPTY_STEP."""
    if step == EMPTY_STEP:
        return torch.zeros(0, dtype=torch.int64)
    if step == DENSE_STEP and rank == 0:
        return torch.arange(300 * POS).remainder(VOCAB).view(-1, POS) * 7 % VOCAB
    base = [5, 100 + rank, 1000 + 13 * step + rank, 20000 + rank * step]
    return torch.tensor(base * 2).view(1, POS)


def backward(m: Net, step: int, rank: int) -> None:
    m(tokens(step, rank)).square().mean().backward()


def make(hvd: Any, plan: Any) -> tuple[Net, Any]:
    import hipress.horovod

    m = Net()
    opt = hipress.horovod.DistributedOptimizer(
        torch.optim.SGD(m.parameters(), lr=0.5), named_parameters=m.named_parameters(),
        algorithm="onebit", plan=plan, seed=3,
    )  # fmt: skip
    return m, opt


def train(hvd: Any, m: Net, opt: Any, steps: range, tag: str) -> None:
    """Train ``steps``; each step the embeddings' gradients must equal Horovod's allreduce
    (Average) of this rank's own (bit for bit on 2 ranks; up to summation order beyond)."""
    rank = hvd.rank()
    for step in steps:
        twin = Net()
        twin.load_state_dict(m.state_dict())
        opt.zero_grad()
        backward(m, step, rank)
        backward(twin, step, rank)
        opt.synchronize()
        for name in ("tok_emb.weight", "pos_emb.weight"):
            p = dict(twin.named_parameters())[name]
            mine = p.grad if p.grad is not None else torch.zeros_like(p)
            want = hvd.allreduce(mine, op=hvd.Average, name=f"want.{tag}.{step}.{name}")
            got = dict(m.named_parameters())[name].grad
            same = torch.equal(got, want) if hvd.size() == 2 else torch.allclose(
                got, want, rtol=1e-6, atol=1e-9)  # fmt: skip
            if not same:
                diff = (got - want).abs().max().item()
                raise AssertionError(f"{tag} step {step}: {name} differs by {diff}")
        with opt.skip_synchronize():
            opt.step()


def entry(opt: Any, name: str) -> Any:
    return next(e for e in opt.hipress_sync.plan.entries if e.name == name)


def expect_decision(opt: Any) -> None:
    tok, pos = entry(opt, "tok_emb.weight"), entry(opt, "pos_emb.weight")
    if not (tok.row_bound and tok.rows == VOCAB and not tok.compress) or pos.row_bound:
        prices = opt.hipress_sync.plan.meta.get("row_prices")
        raise AssertionError(f"decided tok_emb {tok}, pos_emb {pos} (row prices {prices})")
    if not tok.row_bound < 300:  # (so DENSE_STEP falls back to a dense step)
        raise AssertionError(f"bound {tok.row_bound} is not below the dense step's rows")


def check_auto(hvd: Any) -> None:
    """SeCoPa prices both embeddings at construction; the first step's counts decide each by
    its break-even (dense for the all-touched one); gradients stay exact throughout."""
    m, opt = make(hvd, "auto")
    prices = opt.hipress_sync.plan.meta.get("row_prices", {})
    if set(prices) != {"tok_emb.weight", "pos_emb.weight"}:
        raise AssertionError(f"row prices for {sorted(prices)}")
    if any(entry(opt, n).row_bound for n in prices):
        raise AssertionError("rows decided before any step was counted")
    train(hvd, m, opt, range(STEPS), "auto")
    prices = opt.hipress_sync.plan.meta["row_prices"]
    for name, price in prices.items():  # (the choice follows SeCoPa's break-even count)
        rows = price["touched"] <= price["breakeven"]
        if (
            price["chosen"] != ("rows" if rows else "dense")
            or bool(entry(opt, name).row_bound) != rows
        ):
            raise AssertionError(f"{name}: {price} but the plan runs {entry(opt, name)}")
    # (whether the sparse table pays as rows follows the measured prices, which move with
    # the machine's load: the choice is checked against them above, not fixed here)
    if entry(opt, "pos_emb.weight").row_bound:
        raise AssertionError(f"the all-touched table went as rows: {prices['pos_emb.weight']}")


def check_default(hvd: Any) -> None:
    """The default rule decides by the unpriced rule; Horovod's zero-gradient step of
    ``broadcast_optimizer_state`` does not decide; exact with repeated rows, a denser step
    and an empty one."""
    m, opt = make(hvd, None)
    hvd.broadcast_parameters(m.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)  # (a step on zero gradients)
    if opt.hipress_sync.rows.measured is not None:
        raise AssertionError("a step with no touched row decided")
    train(hvd, m, opt, range(STEPS), "default")
    expect_decision(opt)
    if opt.hipress_sync.rows.measured["tok_emb.weight"][1] < 4:
        raise AssertionError(f"counted {opt.hipress_sync.rows.measured}")


def check_resume(hvd: Any) -> None:
    """A run saved after the decision and resumed in fresh objects runs bit for bit as the
    uninterrupted one: same plan (no new count), same states, same parameters."""
    whole, opt_w = make(hvd, None)
    train(hvd, whole, opt_w, range(STEPS), "whole")
    first, opt_f = make(hvd, None)
    train(hvd, first, opt_f, range(2), "first")
    saved = (first.state_dict(), opt_f.state_dict(), opt_f.compression_state_dict())
    second, opt_s = make(hvd, None)
    second.load_state_dict(saved[0])
    opt_s.load_state_dict(saved[1])
    opt_s.load_compression_state_dict(saved[2])
    if opt_s.hipress_sync.plan.digest() != opt_f.hipress_sync.plan.digest():
        raise AssertionError("the resumed plan differs from the saved run's")
    bad = dict(saved[2], rows={"measured": {"tok_emb.weight": [VOCAB, 1]}})
    _, opt_t = make(hvd, None)
    try:
        opt_t.load_compression_state_dict(bad)
    except Exception as exc:  # (the type is checked below)
        if type(exc).__name__ != "HorovodSyncError" or "row decision" not in str(exc):
            raise AssertionError(f"a foreign decision raised {exc!r}") from None
    else:
        raise AssertionError("a decision for other tensors was loaded")
    if any(e.row_bound for e in opt_t.hipress_sync.plan.entries):
        raise AssertionError("a refused load left a decision behind")
    train(hvd, second, opt_s, range(2, STEPS), "second")
    for (n, a), b in zip(whole.named_parameters(), second.parameters(), strict=True):
        if not torch.equal(a, b):
            raise AssertionError(f"{n} differs after resuming")
    ws, ss = opt_w.compression_state_dict(), opt_s.compression_state_dict()
    if ws["digest"] != ss["digest"]:  # (the seal hashes every state and the decision)
        raise AssertionError("the compression states differ after resuming")


def _worker(checks: list[str]) -> int:
    import horovod.torch as hvd

    hvd.init()
    failed = 0
    for name in checks:
        t0 = time.perf_counter()
        try:
            globals()[f"check_{name}"](hvd)
            took = time.perf_counter() - t0
            print(f"[rank {hvd.rank()}] CHECK {name} ok ({took:.1f} s)", flush=True)
        except Exception as exc:  # report every check, then fail the process
            failed += 1
            print(f"[rank {hvd.rank()}] CHECK {name} FAIL {exc!r}", flush=True)
            traceback.print_exc()
    hvd.shutdown()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1:]))
