"""The demo: its corpus, its model, its worker launcher, and a small end-to-end run of
``hipress demo`` with real gloo workers."""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from hipress.bench.gpt import GPTConfig
from hipress.bench.netsim import ShapedNetwork, shaping_unavailable_reason
from hipress.cli import main
from hipress.cli.demo import format_summary
from hipress.demo import (
    DemoConfig,
    DemoError,
    DemoResult,
    EvalPoint,
    ModelConfig,
    RunResult,
    RunSpec,
    WordLM,
    load_corpus,
)
from hipress.demo.data import (
    NL,
    build_vocab,
    eval_windows,
    sample_batch,
    shard,
    stdlib_files,
    tokenize_text,
)
from hipress.demo.launch import launch
from hipress.demo.models import model_config, model_name
from hipress.demo.wordlm import evaluate

# ---------------------------------------------------------------------------- corpus


@pytest.fixture(scope="module")
def corpus():  # type: ignore[no-untyped-def]
    return load_corpus(2048)


def test_tokenize_text() -> None:
    text = "def f(x_1, y):\n\n    return x_1+42  # ok\n   \n"
    assert tokenize_text(text) == [
        *("def", "f", "(", "x_1", ",", "y", ")", ":", NL),
        *("return", "x_1", "+", "42", "#", "ok", NL),
    ]
    assert tokenize_text("\n  \n") == []


def test_vocab_ranks_by_count_then_text() -> None:
    counts = Counter({"b": 3, "a": 3, "c": 5, "d": 1, NL: 9})
    v = build_vocab(counts, 5)
    assert v.itos == ("<unk>", NL, "c", "a", "b")
    assert v.encode(["c", "d", NL, "zz"]).tolist() == [2, 0, 1, 0]


def test_corpus_is_deterministic_and_non_trivial(corpus) -> None:  # type: ignore[no-untyped-def]
    again = load_corpus(2048)
    assert again.digest() == corpus.digest()
    assert torch.equal(again.train, corpus.train) and torch.equal(again.valid, corpus.valid)
    assert len(corpus.vocab) == 2048
    assert corpus.train.numel() > 300_000 and corpus.valid.numel() > 20_000
    assert int(corpus.train.max()) < 2048 and int(corpus.train.min()) >= 0
    assert not set(corpus.train_files) & set(corpus.valid_files)  # split by file
    names = {p.stem for p in stdlib_files()}
    assert set(corpus.train_files) | set(corpus.valid_files) == names
    for word in ("def", "return", "self", "import", NL):
        assert word in corpus.vocab.stoi
    assert corpus.unk_rate < 0.2
    # real text: many distinct tokens in use, the most common far from dominating
    used = torch.bincount(corpus.train, minlength=2048)
    assert int((used > 0).sum()) == 2048
    assert float(used.max()) / corpus.train.numel() < 0.2
    assert load_corpus(1024).digest() != corpus.digest()


def test_batches_shards_and_windows(corpus) -> None:  # type: ignore[no-untyped-def]
    ids = corpus.train
    parts = [shard(ids, r, 3) for r in range(3)]
    assert torch.equal(torch.cat(parts), ids)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    x, y = sample_batch(parts[1], 4, 16, g1)
    x2, _ = sample_batch(parts[1], 4, 16, g2)
    assert x.shape == y.shape == (4, 16) and torch.equal(x, x2)
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the next tokens
    full = eval_windows(corpus.valid, 16, 4096)
    split = [eval_windows(corpus.valid, 16, 4096, r, 2) for r in range(2)]
    assert sum(b[1].numel() for b in full) == 4096
    assert sorted(b[0][0, 0].item() for s in split for b in s) == sorted(
        b[0][0, 0].item() for b in full
    )


# ---------------------------------------------------------------------------- model


@pytest.fixture
def one_thread():  # type: ignore[no-untyped-def]
    # small ops on 2 OpenMP threads slow down ~40x when the cores are shared with other jobs
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_model_loss_decreases(corpus, one_thread) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = WordLM(ModelConfig(vocab_size=2048, emb_dim=32, hidden=32))
    opt = torch.optim.Adam(model.parameters(), lr=2e-2)
    gen = torch.Generator().manual_seed(0)
    windows = eval_windows(corpus.valid, 32, 1024)
    before, _, count = evaluate(model, windows)
    assert before / count == pytest.approx(math.log(2048), abs=0.3)
    for _ in range(30):
        x, y = sample_batch(corpus.train, 8, 32, gen)
        loss = nn.functional.cross_entropy(model(x).reshape(-1, 2048), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    after, correct, count = evaluate(model, windows)
    assert after / count < before / count - 2.0  # from log(V) ~ 7.6 to ~ 4 nats
    assert correct / count > 0.03  # far above chance (1/2048)
    tied = WordLM(ModelConfig(vocab_size=100, emb_dim=16, hidden=16, tied=True))
    assert tied.decoder.weight is tied.embedding.weight
    with pytest.raises(ValueError, match="tied"):
        ModelConfig(hidden=32, emb_dim=16, tied=True)


# ---------------------------------------------------------------------------- launcher


def _fail_on_rank1(rank: int, world: int, message: str) -> int:
    if rank == 1:
        raise ValueError(message)
    dist.barrier()  # rank 0 waits for a peer that is gone
    return rank


def test_worker_failure_ends_the_job_with_its_message() -> None:
    t0 = time.monotonic()
    with pytest.raises(DemoError) as info:
        launch(_fail_on_rank1, 2, ("boom from rank one",), timeout=120)
    text = str(info.value)
    assert "rank 1: ValueError: boom from rank one" in text
    assert "_fail_on_rank1" in text  # the traceback
    assert time.monotonic() - t0 < 100  # stopped well before the timeout


def test_config_is_validated() -> None:
    with pytest.raises(DemoError, match="steps=0"):
        DemoConfig(steps=0)
    assert DemoConfig(steps=10, eval_points=3).eval_steps() == [4, 7, 10]


def test_cli_rejects_unknown_algorithm(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--algorithm", "no-such-alg"]) == 2  # a usage error, before any work
    assert "no-such-alg" in capsys.readouterr().err


# ---------------------------------------------------------------------------- end to end


def test_demo_end_to_end(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    args = [
        *("demo", "--workers", "2", "--steps", "6", "--batch", "4", "--seq-len", "16"),
        *("--vocab", "2048", "--emb-dim", "64", "--hidden", "32", "--plan", "default"),
        *("--algorithm", "onebit", "--out", str(tmp_path), "--quiet", "--timeout", "240"),
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "uncompressed" in out and "hipress onebit" in out
    data = json.loads((tmp_path / "demo.json").read_text())
    base, hip = data["runs"]
    assert data["config"]["workers"] == 2 and data["parameters"] > 0
    for run in (base, hip):
        assert len(run["train_loss"]) == 6
        assert all(math.isfinite(v) for v in run["train_loss"])
        assert run["final"]["step"] == 6 and 0.0 <= run["final"]["accuracy"] <= 1.0
        assert run["samples_per_s"] > 0
    # the same initial weights and batches: the first step's loss is identical
    assert hip["train_loss"][0] == pytest.approx(base["train_loss"][0], rel=1e-6)
    assert base["ratio"] == 1.0 and base["bytes_per_step"] == 4 * data["parameters"]
    assert hip["compressed_tensors"] >= 1  # the output layer (the embedding travels as rows)
    assert hip["ratio"] < 0.25  # onebit on the large tensors
    assert hip["bytes_total"] == pytest.approx(hip["bytes_per_step"] * 6 * 2)
    if data["chart"] is not None:
        assert (tmp_path / "demo.png").stat().st_size > 10_000
        assert (tmp_path / "demo-prediction.png").stat().st_size > 10_000
        assert f"{tmp_path / 'demo-prediction.png'}" in out
    # each run keeps the timeline of its timed steps (here 6 - 5 warm-up = 1), one file per rank
    assert "where a traced step's time went" in out
    for run, name in ((base, "uncompressed"), (hip, "hipress-onebit")):
        assert [Path(t).name for t in run["traces"]] == [f"{name}-rank0.json",
                                                         f"{name}-rank1.json"]  # fmt: skip
        assert run["breakdown"]["step"] > 0 and run["breakdown"]["compute"] > 0
    assert hip["breakdown"]["encode"] > 0 and base["breakdown"]["encode"] == 0


def _allreduce_rank(rank: int, world: int) -> float:
    x = torch.tensor([float(rank + 1)])
    dist.all_reduce(x)
    return float(x)


@pytest.mark.skipif(
    shaping_unavailable_reason() is not None, reason="network namespaces need root and iproute2"
)
def test_launch_inside_simulated_network() -> None:
    with ShapedNetwork(2, rate_mbit=None) as net:
        assert launch(_allreduce_rank, 2, timeout=120, net=net) == [3.0, 3.0]


def _result(compressed: int) -> DemoResult:
    def run(name: str, alg: str | None, sent: float, acc: float, n: int) -> RunResult:
        return RunResult(
            spec=RunSpec(name, alg),
            plan="-" if alg is None else f"{n}/7 tensors compressed",
            compressed_tensors=n,
            tensors=7,
            wall_s=10.0,
            cpu_s=9.0,
            train_s=8.0,
            timed_steps=10,
            samples_per_s=50.0,
            tokens_per_s=1600.0,
            bytes_per_step=sent,
            bytes_uncompressed_per_step=4e6,
            bytes_total=sent * 20,
            train_loss=[5.0] * 10,
            evals=[EvalPoint(10, 4.0, acc)],
            sync={"encode_ms": 1.0, "decode_ms": 1.0, "sync_ms": 2.0} if alg else {},
        )

    base = run("uncompressed", None, 4e6, 0.3, 0)
    hip = run("hipress topk", "topk", 1e5 if compressed else 4e6, 0.29, compressed)
    return DemoResult(DemoConfig(steps=10), "corpus", "d", 10**6, [base, hip], 20.0)


def test_summary_compares_runs_and_explains_an_empty_plan() -> None:
    text = format_summary(_result(4))
    assert "hipress topk sent 2.5% of the bytes of uncompressed (40.0x less)" in text
    assert "29.0% vs 30.0%" in text and "SeCoPa compressed nothing" not in text
    assert "SeCoPa compressed nothing" in format_summary(_result(0))
    assert "Try --bandwidth 1gbit" in format_summary(_result(0))  # on loopback: a slower network


# ---------------------------------------------------------------------------- the GPT option


def test_model_configs_by_name() -> None:
    lstm = model_config("lstm", 2048, 32)
    assert isinstance(lstm, ModelConfig) and (lstm.emb_dim, lstm.layers) == (384, 1)
    gpt = model_config("gpt", 2048, 64)
    assert isinstance(gpt, GPTConfig) and gpt.tied and (gpt.context, gpt.dim) == (64, 128)
    assert not model_config("gpt-untied", 2048, 64, emb_dim=32, layers=1).tied
    assert [model_name(c) for c in (lstm, gpt)] == ["lstm", "gpt"]
    with pytest.raises(ValueError, match="LSTM's width"):
        model_config("gpt", 2048, 64, hidden=64)
    with pytest.raises(ValueError, match="unknown model"):
        model_config("bert", 2048, 64)
    with pytest.raises(DemoError, match="longer than the GPT's context"):
        DemoConfig(seq_len=65, model=gpt)


def test_demo_trains_the_untied_gpt(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    args = [
        *("demo", "--model", "gpt-untied", "--workers", "2", "--steps", "3", "--batch", "2"),
        *("--seq-len", "16", "--vocab", "2048", "--emb-dim", "32", "--layers", "1"),
        *("--plan", "default", "--algorithm", "onebit", "--bandwidth", "loopback"),
        *("--out", str(tmp_path), "--quiet", "--no-chart", "--no-trace", "--timeout", "240"),
    ]
    assert main(args) == 0
    assert "GPT-2-style transformer LM" in capsys.readouterr().out
    data = json.loads((tmp_path / "demo.json").read_text())
    assert data["model"] == "gpt-untied" and data["config"]["model"]["context"] == 16
    # embedding, position embedding, one block, final LayerNorm, head
    assert data["parameters"] == 2 * 2048 * 32 + 16 * 32 + 12 * 32 * 32 + 13 * 32 + 2 * 32
    base, hip = data["runs"]
    assert hip["train_loss"][0] == pytest.approx(base["train_loss"][0], rel=1e-6)
    assert all(math.isfinite(v) for v in hip["train_loss"])
    assert hip["ratio"] < 0.35  # onebit on the head; the token embedding travels as rows
