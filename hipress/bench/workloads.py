"""Benchmark workloads: a communication-heavy word-level LSTM language model on a corpus made from
Python's own standard-library sources, a GPT-2-style transformer LM on the same corpus with tied
(``gpt``) or untied (``gpt-untied``) input/output embeddings (:mod:`hipress.bench.gpt`), a
compute-heavy small ResNet on synthetic images, and a tabular classifier (:class:`TabularMLP`)
on a synthetic teacher-student task (:func:`tabular_data`) for accuracy.

    spec = WORKLOADS["lstm-lm"]
    model = spec.build()                     # same weights on every rank (seeded)
    x, y = spec.batch(rank, step)            # this rank's mini-batch for this step
    loss = spec.loss(model(x), y)

The LSTM LM's vocabulary is large (its embedding and softmax hold most of its parameters: many
gradient bytes per unit of compute, like the LSTM/Transformer LMs of the papers). The GPT's
token embedding holds most of its parameters too; tied, its gradient is dense (the head's
contribution reaches every row), untied, the input embedding's gradient is non-zero only in the
rows of the batch's tokens and the head is a separate dense matrix. The ResNet's
inputs are synthetic random images: fine for throughput, meaningless for accuracy.
"""

from __future__ import annotations

import collections
import functools
import re
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hipress.bench.gpt import GPT, GPTConfig, lm_loss

__all__ = [
    "GPT_BATCH",
    "GPT_CONTEXT",
    "GPT_VOCAB",
    "LSTMLM",
    "WORKLOADS",
    "Corpus",
    "SmallResNet",
    "Tabular",
    "TabularMLP",
    "Workload",
    "lm_batch",
    "load_corpus",
    "stdlib_text",
    "tabular_data",
]

_TOKEN = re.compile(r"[A-Za-z_]+|\d+|[^\sA-Za-z_\d]")


def stdlib_text(max_bytes: int = 8 << 20) -> str:
    """Up to ``max_bytes`` of the standard library's ``.py`` sources, in a fixed file order (the
    same text on every machine with the same Python)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    parts: list[str] = []
    total = 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or "test" in path.parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        parts.append(text)
        total += len(text)
        if total >= max_bytes:
            break
    return "\n".join(parts)[:max_bytes]


@dataclass(frozen=True)
class Corpus:
    """Token ids of a text under a vocabulary of its ``vocab_size - 1`` most frequent words plus
    ``<unk>`` (id 0). ``train`` and ``valid`` are 1-D int64 tensors (the last 5% is valid)."""

    vocab_size: int
    train: torch.Tensor
    valid: torch.Tensor
    words: tuple[str, ...] = field(repr=False)


@lru_cache(maxsize=4)
def load_corpus(vocab_size: int = 32768, max_bytes: int = 8 << 20) -> Corpus:
    """Tokenise :func:`stdlib_text` into words, numbers and punctuation; returns a
    :class:`Corpus`. Deterministic; a few seconds for 8 MB."""
    tokens = _TOKEN.findall(stdlib_text(max_bytes))
    counts = collections.Counter(tokens)
    words = ("<unk>", *(w for w, _ in counts.most_common(vocab_size - 1)))
    index = {w: i for i, w in enumerate(words)}
    ids = torch.tensor([index.get(t, 0) for t in tokens], dtype=torch.int64)
    cut = int(len(ids) * 0.95)
    return Corpus(len(words), ids[:cut], ids[cut:], words)


class LSTMLM(nn.Module):
    """Word-level LSTM LM: a wide embedding, ``layers`` LSTM layers and an adaptive softmax
    (Grave et al. 2017: frequent words in a full head, rare ones in low-rank tail clusters), so
    most parameters (and gradient bytes) sit in the embedding while the softmax stays cheap.
    ``forward(x, y)`` takes int64 ids (batch, seq) and next-word targets of the same shape and
    returns the mean negative log-likelihood; :meth:`predict` returns the most likely next ids."""

    def __init__(
        self, vocab: int, emb: int = 512, hidden: int = 256, layers: int = 2,
        cutoffs: tuple[int, ...] = (2000, 8000),
    ) -> None:  # fmt: skip
        super().__init__()
        self.embed = nn.Embedding(vocab, emb)
        self.lstm = nn.LSTM(emb, hidden, layers, batch_first=True)
        self.out = nn.AdaptiveLogSoftmaxWithLoss(hidden, vocab, list(cutoffs), div_value=4.0)

    def _hidden(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(self.embed(x))
        return h.reshape(-1, h.shape[-1])

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = self.out(self._hidden(x), y.reshape(-1)).loss
        # a tail cluster none of this batch's targets falls in gets no gradient, and DDP requires
        # every parameter to get one on every rank: a zero-weighted term gives it zeros
        return loss + 0.0 * sum(p.sum() for p in self.out.tail.parameters())

    @torch.no_grad()
    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Most likely next id at every position, shaped like ``x``."""
        return self.out.predict(self._hidden(x)).reshape(x.shape)


@dataclass(frozen=True)
class Tabular:
    """A classification data set: ``train_x`` (n, features) float32 and ``train_y`` (n,) int64
    class ids, likewise ``valid_x`` and ``valid_y``; ``bayes`` is the accuracy of the true
    labelling rule on the validation set (the best any classifier can expect)."""

    features: int
    classes: int
    train_x: torch.Tensor = field(repr=False)
    train_y: torch.Tensor = field(repr=False)
    valid_x: torch.Tensor = field(repr=False)
    valid_y: torch.Tensor = field(repr=False)
    bayes: float


@lru_cache(maxsize=4)
def tabular_data(
    train: int = 16384, valid: int = 4096, features: int = 32, classes: int = 10
) -> Tabular:
    """A synthetic teacher-student classification task, generated deterministically (the same
    tensors on every machine with the same torch; nothing is downloaded): Gaussian inputs, a
    fixed random two-layer tanh network's logits (scale 8) plus Gumbel noise as the label, so
    the labels are noisy (the rule scores about 83% on its own samples) and a student sees the
    rule only through ``train`` samples. The first ``train`` samples train, the next ``valid``
    validate."""
    g = torch.Generator().manual_seed(20180430)
    hidden = 32
    w1 = torch.randn(features, hidden, generator=g) / features**0.5
    w2 = torch.randn(hidden, classes, generator=g) / hidden**0.5
    n = train + valid
    x = torch.randn(n, features, generator=g)
    logits = 8.0 * torch.tanh(2.0 * x @ w1) @ w2
    u = torch.rand(n, classes, generator=g).clamp_(1e-9, 1.0 - 1e-9)
    y = (logits - torch.log(-torch.log(u))).argmax(1)
    bayes = float((logits[train:].argmax(1) == y[train:]).float().mean())
    return Tabular(features, classes, x[:train], y[:train], x[train:], y[train:], bayes)


class TabularMLP(nn.Module):
    """An MLP classifier ``features -> hidden -> 256 -> classes`` (ReLU): with the defaults the
    first weight has 65536 elements and the second 524288, both compressed under CaSync's
    default rule; the rest are small and travel uncompressed. ``forward(x)`` returns logits."""

    def __init__(self, features: int = 32, classes: int = 10, hidden: int = 2048) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(features, hidden), nn.ReLU(),
            nn.Linear(hidden, 256), nn.ReLU(),
            nn.Linear(256, classes),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)  # type: ignore[no-any-return]


def _block(cin: int, cout: int, stride: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
        nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
        nn.BatchNorm2d(cout),
    )


class SmallResNet(nn.Module):
    """A ResNet-style CNN for 3x32x32 images (three stages of residual blocks, ~0.7M parameters):
    much compute per gradient byte."""

    def __init__(self, classes: int = 10, width: int = 32) -> None:
        super().__init__()
        w = width
        self.stem = nn.Sequential(
            nn.Conv2d(3, w, 3, 1, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU()
        )
        chans = [(w, w, 1), (w, 2 * w, 2), (2 * w, 4 * w, 2)]
        self.blocks = nn.ModuleList(_block(a, b, s) for a, b, s in chans)
        self.skips = nn.ModuleList(
            nn.Identity() if s == 1 and a == b else nn.Conv2d(a, b, 1, s, bias=False)
            for a, b, s in chans
        )
        self.head = nn.Linear(4 * w, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block, skip in zip(self.blocks, self.skips, strict=True):
            x = torch.relu(block(x) + skip(x))
        return self.head(x.mean((2, 3)))


@dataclass(frozen=True)
class Workload:
    """A model and its per-rank batches.

    Fields: ``name``; ``kind`` ("communication-heavy" or "compute-heavy"); ``batch_size``
    (samples per rank per step); ``unit`` (what a sample is); ``data`` (where inputs come from);
    ``prepare()`` (loads the data once in the parent, picklable); ``build(data)`` (the model, the
    same seeded weights on every call); ``batch(data, rank, step)`` (that rank's inputs and
    targets, deterministic); ``loss(model, x, y)`` (mean loss; ``model`` may be DDP-wrapped).
    """

    name: str
    kind: str
    batch_size: int
    unit: str
    data: str
    prepare: Callable[[], Any]
    build: Callable[[Any], nn.Module]
    batch: Callable[[Any, int, int], tuple[torch.Tensor, torch.Tensor]]
    loss: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


LM_VOCAB, LM_BATCH, LM_BPTT = 32768, 8, 32


def _lm_build(corpus: Corpus) -> nn.Module:
    torch.manual_seed(0)
    return LSTMLM(corpus.vocab_size)


def lm_batch(
    ids: torch.Tensor, rank: int, step: int, batch: int = LM_BATCH, bptt: int = LM_BPTT
) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` random windows of ``bptt + 1`` tokens of ``ids`` (seeded by rank and step):
    inputs and next-token targets, each (batch, bptt)."""
    g = torch.Generator().manual_seed(rank * 1_000_003 + step)
    starts = torch.randint(0, len(ids) - bptt - 1, (batch,), generator=g)
    seqs = torch.stack([ids[s : s + bptt + 1] for s in starts.tolist()])
    return seqs[:, :-1], seqs[:, 1:]


def _lm_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return model(x, y)  # type: ignore[no-any-return]


GPT_VOCAB, GPT_BATCH, GPT_CONTEXT = 16384, 2, 128


def _gpt_build(tied: bool, corpus: Corpus) -> nn.Module:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=corpus.vocab_size, context=GPT_CONTEXT, tied=tied))


def _gpt_batch(corpus: Corpus, rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    return lm_batch(corpus.train, rank, step, GPT_BATCH, GPT_CONTEXT)


def _gpt_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return lm_loss(model(x), y)


def _gpt(name: str, tied: bool) -> Workload:
    how = "tied" if tied else "untied"
    return Workload(
        name,
        "communication-heavy",
        GPT_BATCH,
        f"sequences of {GPT_CONTEXT} tokens",
        f"Python stdlib sources, {GPT_VOCAB}-word vocabulary; {how} input/output embeddings",
        lambda: load_corpus(GPT_VOCAB),
        functools.partial(_gpt_build, tied),
        _gpt_batch,
        _gpt_loss,
    )


RES_BATCH = 32


def _res_build(_: Any) -> nn.Module:
    torch.manual_seed(0)
    return SmallResNet()


def _res_batch(_: Any, rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(rank * 1_000_003 + step)
    x = torch.randn(RES_BATCH, 3, 32, 32, generator=g)
    return x, torch.randint(0, 10, (RES_BATCH,), generator=g)


def _res_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(model(x), y)


WORKLOADS: dict[str, Workload] = {
    "lstm-lm": Workload(
        "lstm-lm",
        "communication-heavy",
        LM_BATCH,
        f"sequences of {LM_BPTT} tokens",
        f"Python stdlib sources, {LM_VOCAB}-word vocabulary",
        lambda: load_corpus(LM_VOCAB),
        _lm_build,
        lambda c, r, s: lm_batch(c.train, r, s),
        _lm_loss,
    ),
    "gpt": _gpt("gpt", tied=True),
    "gpt-untied": _gpt("gpt-untied", tied=False),
    "resnet": Workload(
        "resnet",
        "compute-heavy",
        RES_BATCH,
        "3x32x32 images",
        "synthetic random images (throughput only)",
        lambda: None,
        _res_build,
        _res_batch,
        _res_loss,
    ),
}
