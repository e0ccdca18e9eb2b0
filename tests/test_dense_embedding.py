"""An embedding whose gradient is dense (an input embedding tied to the output layer) is
compressed like any matrix once its rows are counted (:func:`hipress.codec.rowplan.plan_rows`
with the plan's ``dense_choice``), while a sparse one still travels as exact rows: real gloo
groups, every rank agreeing, the decision surviving a checkpoint."""

from __future__ import annotations

import io

import torch
from dist_utils import run_workers
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from hipress.casync import CaSyncState, register
from hipress.codec.rowplan import decide_rows, plan_rows
from hipress.core.plan import Plan, Strategy, TensorPlan

VOCAB, DIM, SPARSE = 1024, 64, 2048


class _Tied(nn.Module):
    """A token embedding whose matrix is also the output layer's (every row gets a gradient),
    beside a second, untied embedding whose gradient has a few rows."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.tok = nn.Embedding(VOCAB, DIM)
        self.side = nn.Embedding(SPARSE, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok(x) + self.side(x % 7)
        return nn.functional.linear(h, self.tok.weight)


def _batch(step: int, rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(10 * step + rank)
    return torch.randint(0, VOCAB, (2, 8), generator=g)


def _train(model: nn.Module, ddp: DDP, state, steps: range, rank: int) -> list[torch.Tensor]:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in steps:
        opt.zero_grad()
        x = _batch(step, rank)
        logits = ddp(x)
        nn.functional.cross_entropy(logits.view(-1, VOCAB), x.view(-1)).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _run(rank: int, n: int) -> dict[str, object]:
    model = _Tied()
    ddp = DDP(model)
    state = register(ddp, "onebit", log_every=0)
    _train(model, ddp, state, range(3), rank)
    entries = {e.name: e for e in state.plan.entries}
    saved = io.BytesIO()
    torch.save(state.state_dict(), saved)
    opt_state = [p.detach().clone() for p in model.parameters()]
    after = _train(model, ddp, state, range(3, 5), rank)
    # the same two steps again from the checkpoint, in a fresh model, DDP and state
    model2 = _Tied()
    with torch.no_grad():
        for p, q in zip(model2.parameters(), opt_state, strict=True):
            p.copy_(q)
    ddp2 = DDP(model2)
    saved.seek(0)
    ckpt = torch.load(saved, weights_only=False)
    state2 = register(ddp2, "onebit", plan=CaSyncState.plan_of(ckpt), log_every=0)
    state2.load_state_dict(ckpt)
    again = _train(model2, ddp2, state2, range(3, 5), rank)
    return {
        "tok": (entries["tok.weight"].compress, entries["tok.weight"].row_bound),
        "side": (entries["side.weight"].compress, entries["side.weight"].row_bound),
        "dense": list(state.plan.meta.get("dense_embeddings", [])),
        "finite": all(bool(torch.isfinite(p).all()) for p in after),
        "sum": float(sum(p.double().sum() for p in after)),
        "resumed": all(torch.equal(a, b) for a, b in zip(after, again, strict=True)),
    }


def test_a_tied_embedding_is_compressed_and_a_sparse_one_goes_as_rows() -> None:
    results = run_workers(_run, 4)  # (the default rule's PS: worker and server states)
    for r in results:
        assert r["tok"][0] and r["tok"][1] == 0, r  # compressed as a matrix, not rows
        assert not r["side"][0] and r["side"][1] > 0, r  # exact rows
        assert r["dense"] == ["tok.weight"] and r["finite"], r
        assert r["resumed"], r  # the decision and its new states survive a checkpoint
    assert len({r["sum"] for r in results}) == 1  # every rank holds the same weights


def _plan() -> Plan:
    return Plan("onebit", {}, 2, (
        TensorPlan("tok.weight", VOCAB * DIM, False, Strategy.ALLREDUCE),
        TensorPlan("w", 4096, True, Strategy.ALLGATHER),
    ), meta={"kept_plain": {"tok.weight": "embedding"},
             "dense_choice": {"tok.weight": {"strategy": "ps", "partitions": 2,
                                             "predicted_ms": 1.5}}})  # fmt: skip


def test_every_row_touched_takes_the_recorded_choice() -> None:
    plan = plan_rows(_plan(), {"tok.weight": (VOCAB, VOCAB)}, 2)
    e = plan.entries[0]
    assert (e.compress, e.strategy, e.partitions, e.row_bound) == (True, Strategy.PS, 2, 0)
    assert plan.meta["dense_embeddings"] == ["tok.weight"]
    assert "tok.weight" not in plan.meta["kept_plain"]
    _, chosen, lines = decide_rows(_plan(), {"tok.weight": (VOCAB, VOCAB)}, 2)
    assert chosen == ["tok.weight"] and "dense gradient" in lines[0]


def test_one_untouched_row_keeps_the_embedding_plain() -> None:
    plan = plan_rows(_plan(), {"tok.weight": (VOCAB, VOCAB - 1)}, 2)
    assert not plan.entries[0].compress and "dense_embeddings" not in plan.meta
    # without a recorded choice (an explicit plan), a dense count changes nothing
    bare = Plan("onebit", {}, 2, _plan().entries, meta={"kept_plain": {"tok.weight": "embedding"}})
    assert not plan_rows(bare, {"tok.weight": (VOCAB, VOCAB)}, 2).entries[0].compress
