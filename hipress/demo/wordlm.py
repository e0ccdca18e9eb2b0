"""The demo's model: a word-level LSTM language model with a large embedding.

Like the LSTM language models of the HiPress paper, most parameters sit in the embedding and the
output layer (``vocab x dim`` each), so every step synchronises megabytes of gradient for little
compute: gradient communication matters.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["ModelConfig", "WordLM", "evaluate"]


@dataclass(frozen=True)
class ModelConfig:
    """Shape of :class:`WordLM`.

    Fields:
        vocab_size: tokens in the vocabulary (rows of the embedding and the output layer).
        emb_dim: embedding width.
        hidden: LSTM width.
        layers: LSTM layers.
        tied: share the embedding matrix with the output layer (needs ``hidden == emb_dim``).
        dropout: dropout on the embedding and LSTM outputs during training.
    """

    vocab_size: int = 8192
    emb_dim: int = 384
    hidden: int = 128
    layers: int = 1
    tied: bool = False
    dropout: float = 0.0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "emb_dim", "hidden", "layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.tied and self.hidden != self.emb_dim:
            raise ValueError(
                f"tied weights need hidden == emb_dim, got {self.hidden} and {self.emb_dim}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")


class WordLM(nn.Module):
    """Embedding -> LSTM -> linear over the vocabulary.

    ``forward(x)`` takes int64 ids ``[batch, seq]`` and returns logits ``[batch, seq, vocab]``.
    Parameters are initialised from torch's global RNG: seed it for identical models.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        c = config
        self.config = c
        self.embedding = nn.Embedding(c.vocab_size, c.emb_dim)
        self.lstm = nn.LSTM(
            c.emb_dim,
            c.hidden,
            c.layers,
            batch_first=True,
            dropout=c.dropout if c.layers > 1 else 0.0,
        )
        self.drop = nn.Dropout(c.dropout)
        self.decoder = nn.Linear(c.hidden, c.vocab_size)
        nn.init.uniform_(self.embedding.weight, -0.1, 0.1)
        if c.tied:
            self.decoder.weight = self.embedding.weight
        else:
            nn.init.uniform_(self.decoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(self.drop(self.embedding(x)))
        return self.decoder(self.drop(h))

    def num_parameters(self) -> int:
        """Trainable parameters (a tied matrix counts once)."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)


@torch.no_grad()
def evaluate(
    model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]]
) -> tuple[float, int, int]:
    """Summed cross-entropy, correct next-token predictions (argmax) and token count of
    ``model`` over ``batches`` of ``(inputs, targets)``. Restores the model's training mode."""
    was = model.training
    model.eval()
    loss_sum, correct, count = 0.0, 0, 0
    try:
        for x, y in batches:
            logits = model(x)
            flat = logits.reshape(-1, logits.shape[-1])
            loss_sum += float(nn.functional.cross_entropy(flat, y.reshape(-1), reduction="sum"))
            correct += int((flat.argmax(-1) == y.reshape(-1)).sum())
            count += y.numel()
    finally:
        model.train(was)
    return loss_sum, correct, count
