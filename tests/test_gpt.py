"""The GPT-2-style model (hipress.bench.gpt) and its benchmark workloads ``gpt`` and
``gpt-untied``: the shape and the tying, the input embedding's gradient (dense tied, row-sparse
untied), determinism, and a few training steps on 1 and 2 gloo processes through the e2e
benchmark's own worker."""

from __future__ import annotations

import math

import pytest
import torch

from hipress.bench.e2e import COMPUTE, Config, E2EOptions, run_config
from hipress.bench.gpt import GPT, GPTConfig, lm_loss
from hipress.bench.netsim import LoopbackNetwork
from hipress.bench.workloads import GPT_CONTEXT, GPT_VOCAB, WORKLOADS, Corpus

SMALL = GPTConfig(vocab_size=512, context=16, dim=32, layers=2, heads=4)


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    data = WORKLOADS["gpt"].prepare()
    assert data is WORKLOADS["gpt-untied"].prepare()  # one corpus, loaded once
    return data  # type: ignore[no-any-return]


def test_shape_and_tying() -> None:
    tied, untied = GPT(SMALL), GPT(GPTConfig(**{**vars(SMALL), "tied": False}))
    names = [n for n, _ in tied.named_parameters()]
    assert names[:2] == ["embed.weight", "pos.weight"] and "head.weight" not in names
    assert [n for n, _ in untied.named_parameters()][-1] == "head.weight"
    # untied adds exactly one vocab x dim matrix
    assert untied.num_parameters() - tied.num_parameters() == 512 * 32
    x = torch.randint(0, 512, (3, 16))
    assert tied(x).shape == (3, 16, 512) and tied.predict(x).shape == (3, 16)
    # causal: a later token changes no earlier position's logits
    y = x.clone()
    y[:, 10] = (y[:, 10] + 1) % 512
    torch.testing.assert_close(tied(x)[:, :10], tied(y)[:, :10])
    assert not torch.allclose(tied(x)[:, 10:], tied(y)[:, 10:])
    with pytest.raises(ValueError, match="longer than the context"):
        tied(torch.zeros(1, 17, dtype=torch.int64))


def test_config_is_checked() -> None:
    with pytest.raises(ValueError, match="multiple of heads"):
        GPTConfig(dim=30, heads=4)
    with pytest.raises(ValueError, match="layers must be >= 1"):
        GPTConfig(layers=0)
    with pytest.raises(ValueError, match="dropout"):
        GPTConfig(dropout=1.0)


def test_a_fixed_batch_is_learned() -> None:
    torch.manual_seed(0)
    model = GPT(SMALL)
    x = torch.randint(0, 512, (4, 17))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = lm_loss(model(x[:, :-1]), x[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert abs(losses[0] - math.log(512)) < 0.1  # GPT-2's init: near-uniform predictions
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.parametrize("name", ["gpt", "gpt-untied"])
def test_the_input_embeddings_gradient_is_dense_tied_and_row_sparse_untied(
    corpus: Corpus, name: str
) -> None:
    w = WORKLOADS[name]
    model = w.build(corpus)
    x, y = w.batch(corpus, 0, 0)
    assert x.shape == y.shape == (w.batch_size, GPT_CONTEXT)
    assert torch.equal(x[:, 1:], y[:, :-1])  # y is x shifted by one token
    w.loss(model, x, y).backward()
    grad = model.get_parameter("embed.weight").grad
    assert grad is not None and grad.shape[0] == GPT_VOCAB == corpus.vocab_size
    zero_rows = float((grad == 0).all(1).float().mean())
    if name == "gpt":  # the head's gradient reaches every row
        assert zero_rows == 0.0
        return
    # untied: exactly the rows of the batch's tokens are non-zero (> 99% of rows are zeros)
    touched = torch.unique(x)
    assert zero_rows == 1.0 - len(touched) / GPT_VOCAB and zero_rows > 0.99
    assert (grad[touched] != 0).any(1).all()
    assert model.get_parameter("head.weight").grad.ne(0).all(1).float().mean() > 0.99


def test_same_seed_same_losses(corpus: Corpus) -> None:
    w = WORKLOADS["gpt"]

    def losses() -> list[float]:
        model = w.build(corpus)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        out = []
        for step in range(2):
            loss = w.loss(model, *w.batch(corpus, 1, step))
            opt.zero_grad()
            loss.backward()
            opt.step()
            out.append(float(loss.detach()))
        return out

    first = losses()
    assert first == losses() and first[0] != first[1]
    # another rank's batches differ
    assert not torch.equal(w.batch(corpus, 0, 0)[0], w.batch(corpus, 1, 0)[0])


@pytest.mark.parametrize("name", ["gpt", "gpt-untied"])
def test_trains_on_one_and_two_processes_as_the_benchmark_does(corpus: Corpus, name: str) -> None:
    opts = E2EOptions(workers=2, rates_mbit=(None,), models=(name,), algorithms=("onebit",),
                      plans=(None,), steps=2, warmup=3, repeats=1, shaped=False)  # fmt: skip
    with LoopbackNetwork(1, "one process") as solo:
        alone = run_config(solo, name, corpus, COMPUTE, opts)
    configs = [Config("ddp-fp32", "ddp"), Config("hipress-onebit", "hipress", algorithm="onebit",
                                                 plan=None)]  # fmt: skip
    with LoopbackNetwork(2, "test") as net:
        rows = [run_config(net, name, corpus, c, opts) for c in configs]
    assert [r.get("error") for r in [alone, *rows]] == [None] * 3
    for r in [alone, *rows]:
        assert r["samples_per_s"] > 0
        assert math.isfinite(r["final_loss"]) and r["final_loss"] < math.log(GPT_VOCAB)
    onebit = rows[1]
    # the default rule keeps the token embedding plain (tied too); untied, the head compresses
    big = {e[0] for e in onebit["plan"]["entries"] if e[2]}
    assert "embed.weight" not in big and ("head.weight" in big) == (name == "gpt-untied")
    # the input embedding is the last gradient backward produces, tied or not
    leads = alone["grad_ready_lead_ms"]
    assert min(leads, key=leads.__getitem__) == "embed.weight"


def test_fsdp2_shards_the_tied_gpt(corpus: Corpus) -> None:
    """``bench e2e --fsdp``: the tied GPT's embedding stays in the root unit (its head uses the
    matrix outside the embedding's forward); every block is a unit of its own."""
    from hipress.bench import fsdp as fsdp_bench

    with LoopbackNetwork(2, "test") as net:
        row = fsdp_bench.measure(net, "gpt", corpus, fsdp_bench.BASELINES[0], warmup=1,
                                 steps=1, lr=0.05, reshard=True, timeout=300, threads=1)  # fmt: skip
    assert row.get("error") is None, row.get("error")
    units = [name for name, _ in row["traffic"]["gathers_per_unit"]]
    assert sorted(units) == ["<root>", *(f"blocks.{i}" for i in range(4)), "ln_f", "pos"]
