"""The demo's dataset: word-level tokens of the Python standard library's own source files.

Every Python installation carries its standard library as source, so this is real text that is
available offline with nothing to download. The corpus is a deterministic function of the
installation: the top-level ``*.py`` modules of ``sysconfig.get_paths()["stdlib"]``, sorted by
name; every ``valid_every``-th file (by that order) is held out for validation, so the split is by
file and no validation line was seen in training.

Tokens are identifiers/keywords, numbers, single punctuation characters and one ``<nl>`` per
non-empty line (the token ``"\\n"``, :data:`NL`; see :data:`TOKEN_RE`). The vocabulary is the ``vocab_size - 2`` most frequent
training tokens (ties broken by the token's text) plus ``<unk>`` and :data:`NL`.
"""

from __future__ import annotations

import hashlib
import re
import sysconfig
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

__all__ = [
    "NL",
    "TOKEN_RE",
    "UNK",
    "Corpus",
    "DataError",
    "Vocab",
    "build_vocab",
    "eval_windows",
    "load_corpus",
    "sample_batch",
    "shard",
    "stdlib_files",
    "tokenize_text",
]

UNK = "<unk>"
NL = "\n"
TOKEN_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+|\n|\S")


class DataError(ValueError):
    """The corpus cannot be built as asked (no standard library sources, bad sizes)."""


def stdlib_files(root: str | Path | None = None) -> list[Path]:
    """The corpus files: top-level ``*.py`` modules of the standard library, sorted by name.

    ``root`` defaults to ``sysconfig.get_paths()["stdlib"]``. Raises :class:`DataError` if it
    holds fewer than 20 modules (a stripped installation).
    """
    base = Path(root) if root is not None else Path(sysconfig.get_paths()["stdlib"])
    files = sorted((p for p in base.glob("*.py") if p.is_file()), key=lambda p: p.name)
    if len(files) < 20:
        raise DataError(
            f"found {len(files)} Python modules under {base}; the demo needs the standard "
            "library's source files (a full Python installation)"
        )
    return files


def tokenize_text(text: str) -> list[str]:
    """Split source text into tokens: identifiers, numbers, punctuation characters, and
    :data:`NL` at the end of every line that has a token."""
    lines = [line for line in text.splitlines() if line and not line.isspace()]
    if not lines:
        return []
    return TOKEN_RE.findall("\n".join(lines) + "\n")


@dataclass(frozen=True)
class Vocab:
    """A fixed vocabulary. ``itos[i]`` is token ``i``; id 0 is ``<unk>``, id 1 is :data:`NL`."""

    itos: tuple[str, ...]
    stoi: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "stoi", {s: i for i, s in enumerate(self.itos)})

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, tokens: Sequence[str]) -> torch.Tensor:
        """Token ids (int64); tokens outside the vocabulary map to ``<unk>`` (id 0)."""
        table = dict.fromkeys(tokens, 0)  # every distinct token, then the known ones' ids
        table.update((t, i) for t, i in self.stoi.items() if t in table)
        return torch.tensor(list(map(table.__getitem__, tokens)), dtype=torch.int64)


def build_vocab(counts: Counter[str], size: int) -> Vocab:
    """``<unk>``, :data:`NL`, then the ``size - 2`` most frequent other tokens of ``counts``
    (ties broken by text). Raises :class:`DataError` if ``size < 3``."""
    if size < 3:
        raise DataError(f"vocab_size must be at least 3, got {size}")
    ranked = sorted(
        ((c, t) for t, c in counts.items() if t not in (UNK, NL)), key=lambda ct: (-ct[0], ct[1])
    )
    return Vocab((UNK, NL, *(t for _, t in ranked[: size - 2])))


@dataclass(frozen=True)
class Corpus:
    """Token ids of the training and validation files, and the vocabulary.

    Fields:
        vocab: the vocabulary (``len(vocab)`` ids).
        train, valid: 1-D int64 tensors of token ids, files concatenated in name order.
        train_files, valid_files: module names in each split.
        unk_rate: fraction of training tokens mapped to ``<unk>``.
    """

    vocab: Vocab
    train: torch.Tensor
    valid: torch.Tensor
    train_files: tuple[str, ...]
    valid_files: tuple[str, ...]
    unk_rate: float

    def digest(self) -> str:
        """SHA-256 (hex, 16 chars) over the vocabulary and both id streams."""
        h = hashlib.sha256("\0".join(self.vocab.itos).encode())
        h.update(self.train.numpy().tobytes())
        h.update(self.valid.numpy().tobytes())
        return h.hexdigest()[:16]

    def describe(self) -> str:
        """One line: files, tokens and vocabulary size."""
        return (
            f"{len(self.train_files)}+{len(self.valid_files)} stdlib modules, "
            f"{self.train.numel():,} train / {self.valid.numel():,} valid tokens, "
            f"vocab {len(self.vocab):,} ({100 * self.unk_rate:.1f}% <unk>)"
        )


def load_corpus(
    vocab_size: int = 8192, valid_every: int = 10, root: str | Path | None = None
) -> Corpus:
    """Build the corpus from the standard library under ``root`` (default: this Python's).

    Every ``valid_every``-th file in name order (starting with the 5th, so that the validation
    set does not always begin with the same few modules) is held out. The result depends only
    on the files' contents and the arguments. Takes about a second.
    """
    if valid_every < 2:
        raise DataError(f"valid_every must be at least 2, got {valid_every}")
    files = stdlib_files(root)
    train_tok: list[list[str]] = []
    valid_tok: list[list[str]] = []
    train_names: list[str] = []
    valid_names: list[str] = []
    for i, path in enumerate(files):
        toks = tokenize_text(path.read_text(encoding="utf-8", errors="replace"))
        if i % valid_every == valid_every // 2:
            valid_tok.append(toks)
            valid_names.append(path.stem)
        else:
            train_tok.append(toks)
            train_names.append(path.stem)
    counts: Counter[str] = Counter()
    for toks in train_tok:
        counts.update(toks)
    vocab = build_vocab(counts, vocab_size)
    train = vocab.encode([t for toks in train_tok for t in toks])
    valid = vocab.encode([t for toks in valid_tok for t in toks])
    unk = float((train == 0).float().mean()) if train.numel() else 0.0
    return Corpus(vocab, train, valid, tuple(train_names), tuple(valid_names), unk)


def shard(ids: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s contiguous share of ``ids`` (``world_size`` near-equal parts)."""
    if not 0 <= rank < world_size:
        raise DataError(f"rank {rank} is not in 0..{world_size - 1}")
    n = ids.numel()
    return ids[n * rank // world_size : n * (rank + 1) // world_size]


def sample_batch(
    ids: torch.Tensor, batch: int, seq_len: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` random windows of ``ids``: inputs ``[batch, seq_len]`` and next-token targets
    of the same shape. Deterministic given the generator's state."""
    if ids.numel() <= seq_len + 1:
        raise DataError(f"{ids.numel()} tokens cannot form windows of {seq_len + 1}")
    starts = torch.randint(0, ids.numel() - seq_len - 1, (batch,), generator=generator)
    idx = starts[:, None] + torch.arange(seq_len + 1)[None, :]
    win = ids[idx]
    return win[:, :-1], win[:, 1:]


def eval_windows(
    ids: torch.Tensor, seq_len: int, max_tokens: int, rank: int = 0, world_size: int = 1
) -> Sequence[tuple[torch.Tensor, torch.Tensor]]:
    """Non-overlapping validation windows from the start of ``ids`` covering at most
    ``max_tokens`` predicted tokens, in batches of up to 64 windows; rank ``rank`` gets every
    ``world_size``-th batch, so the ranks together cover each window exactly once."""
    n_win = min((ids.numel() - 1) // seq_len, max(1, max_tokens // seq_len))
    if n_win < 1:
        raise DataError(f"{ids.numel()} validation tokens cannot form a window of {seq_len}")
    x = ids[: n_win * seq_len].view(n_win, seq_len)
    y = ids[1 : n_win * seq_len + 1].view(n_win, seq_len)
    batches = [(x[i : i + 64], y[i : i + 64]) for i in range(0, n_win, 64)]
    return batches[rank::world_size]
