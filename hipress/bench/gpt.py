"""A GPT-2-style language model written in torch: token and position embeddings, pre-LayerNorm
transformer blocks (causal multi-head self-attention, a GELU MLP four times as wide), a final
LayerNorm and a linear head over the vocabulary, GPT-2's initialisation.

    model = GPT(GPTConfig(vocab_size=16384))        # tied: the head is the token embedding
    logits = model(x)                               # x: int64 (batch, seq <= context)
    loss = lm_loss(logits, y)

With ``tied`` (GPT-2's own choice) the head shares the token embedding's matrix, so that matrix's
gradient is dense: every row gets the head's contribution. Untied, the input embedding's
gradient is non-zero only in the rows of the tokens in the batch (row-sparse), and the head is a
separate dense matrix. Used by the benchmarks' ``gpt`` and ``gpt-untied`` workloads
(:mod:`hipress.bench.workloads`) and by ``hipress demo --model gpt``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["GPT", "GPTConfig", "lm_loss"]


@dataclass(frozen=True)
class GPTConfig:
    """Shape of :class:`GPT`.

    Fields:
        vocab_size: tokens in the vocabulary (rows of the token embedding and of the head).
        context: the longest input, in tokens (rows of the position embedding).
        dim: model width.
        layers: transformer blocks.
        heads: attention heads per block (``dim`` must be a multiple of it).
        tied: share the token embedding's matrix with the head.
        dropout: dropout on the embeddings, the attention weights and each residual branch.
    """

    vocab_size: int = 16384
    context: int = 128
    dim: int = 128
    layers: int = 4
    heads: int = 4
    tied: bool = True
    dropout: float = 0.0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "context", "dim", "layers", "heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.dim % self.heads:
            raise ValueError(f"dim ({self.dim}) must be a multiple of heads ({self.heads})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")


class _Attention(nn.Module):
    """Causal multi-head self-attention: one projection to queries, keys and values, one out."""

    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.heads, self.dropout = c.heads, c.dropout
        self.qkv = nn.Linear(c.dim, 3 * c.dim)
        self.proj = nn.Linear(c.dim, c.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        p = self.dropout if self.training else 0.0
        y = nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))  # type: ignore[no-any-return]


class _Block(nn.Module):
    """``x + attn(ln1(x))``, then ``x + mlp(ln2(x))`` (GPT-2's pre-LayerNorm block)."""

    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(c.dim)
        self.attn = _Attention(c)
        self.ln2 = nn.LayerNorm(c.dim)
        self.fc = nn.Linear(c.dim, 4 * c.dim)
        self.proj = nn.Linear(4 * c.dim, c.dim)
        self.drop = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln1(x)))
        h = nn.functional.gelu(self.fc(self.ln2(x)), approximate="tanh")
        return x + self.drop(self.proj(h))  # type: ignore[no-any-return]


class GPT(nn.Module):
    """A GPT-2-style decoder-only language model (see the module docstring).

    ``forward(x)`` takes int64 ids ``(batch, seq)`` with ``seq <= config.context`` and returns
    logits ``(batch, seq, vocab_size)``; position ``i`` predicts token ``i + 1``. Parameters are
    initialised from torch's global RNG (seed it for identical models): normal with standard
    deviation 0.02, the residual branches' output projections scaled by ``1/sqrt(2 layers)``,
    biases zero. Named parameters: ``embed.weight``, ``pos.weight``, ``blocks.{i}.*``,
    ``ln_f.*`` and, untied only, ``head.weight`` (tied, the head's matrix is ``embed.weight``
    and ``head`` is None).
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        c = self.config = config
        self.embed = nn.Embedding(c.vocab_size, c.dim)
        self.pos = nn.Embedding(c.context, c.dim)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(_Block(c) for _ in range(c.layers))
        self.ln_f = nn.LayerNorm(c.dim)
        # tied, the head is the token embedding's matrix, used in forward (no module of its
        # own: a module holding another's parameter cannot be a sharding unit of its own)
        self.head = None if c.tied else nn.Linear(c.dim, c.vocab_size, bias=False)
        self.apply(_init)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):  # residual branches: GPT-2's depth scaling
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * c.layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        if t > self.config.context:
            raise ValueError(f"sequence of {t} tokens is longer than the context "
                             f"({self.config.context})")  # fmt: skip
        h = self.drop(self.embed(x) + self.pos(torch.arange(t, device=x.device)))
        for block in self.blocks:
            h = block(h)
        h = self.ln_f(h)
        if self.head is None:
            return nn.functional.linear(h, self.embed.weight)
        return self.head(h)  # type: ignore[no-any-return]

    @torch.no_grad()
    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Most likely next id at every position, shaped like ``x``."""
        return self(x).argmax(-1)

    def num_parameters(self) -> int:
        """Trainable parameters (a tied matrix counts once)."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)


def _init(m: nn.Module) -> None:
    if isinstance(m, nn.Linear | nn.Embedding):
        nn.init.normal_(m.weight, 0.0, 0.02)
    if isinstance(m, nn.Linear) and m.bias is not None:
        nn.init.zeros_(m.bias)


def lm_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of ``logits`` ``(..., vocab)`` against ids ``y`` ``(...)``."""
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
