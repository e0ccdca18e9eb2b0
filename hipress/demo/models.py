"""The demo's models, by name: ``lstm`` (:class:`~hipress.demo.wordlm.WordLM`, the default),
``gpt`` (:class:`~hipress.bench.gpt.GPT`, GPT-2-style, tied input/output embeddings) and
``gpt-untied`` (the same, untied).

    config = model_config("gpt", vocab_size=8192, seq_len=128)
    model = build_model(config)                 # forward(x) -> logits, as every demo model
"""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from hipress.bench.gpt import GPT, GPTConfig
from hipress.demo.wordlm import ModelConfig, WordLM

__all__ = [
    "MODELS",
    "DemoModel",
    "build_model",
    "defaults",
    "describe_model",
    "model_config",
    "model_name",
]

MODELS = ("lstm", "gpt", "gpt-untied")
DemoModel = ModelConfig | GPTConfig

# each model's own defaults where the command line leaves a setting out
_DEFAULTS = {
    "lstm": {"emb_dim": ModelConfig.emb_dim, "layers": ModelConfig.layers, "batch": 16,
             "seq_len": 32},
    "gpt": {"emb_dim": 128, "layers": 4, "batch": 4, "seq_len": 128},
}  # fmt: skip


def defaults(name: str) -> dict[str, int]:
    """Model ``name``'s defaults of ``emb_dim``, ``layers``, ``batch`` and ``seq_len`` (the
    GPT's: 512 tokens per worker per step, like the LSTM's 16 x 32). Raises ValueError for an
    unknown name."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}: choose one of {', '.join(MODELS)}")
    return dict(_DEFAULTS["lstm" if name == "lstm" else "gpt"])


def model_config(
    name: str,
    vocab_size: int,
    seq_len: int,
    emb_dim: int | None = None,
    layers: int | None = None,
    hidden: int | None = None,
) -> DemoModel:
    """The shape of model ``name`` (see :data:`MODELS`) for a ``vocab_size``-token vocabulary
    and sequences of ``seq_len`` tokens (a GPT's context); ``None`` takes the model's default.
    ``hidden`` is the LSTM's width: a GPT has none (its width is ``emb_dim``). Raises ValueError
    for an unknown name or a shape the model cannot take."""
    d = defaults(name)
    width = d["emb_dim"] if emb_dim is None else emb_dim
    depth = d["layers"] if layers is None else layers
    if name == "lstm":
        base = ModelConfig(vocab_size=vocab_size, emb_dim=width, layers=depth)
        return base if hidden is None else replace(base, hidden=hidden)
    if hidden is not None:
        raise ValueError(f"--hidden is the LSTM's width; {name}'s width is --emb-dim")
    return GPTConfig(vocab_size, seq_len, width, depth, tied=name == "gpt")


def model_name(config: DemoModel) -> str:
    """The name (see :data:`MODELS`) of the model ``config`` shapes."""
    if isinstance(config, GPTConfig):
        return "gpt" if config.tied else "gpt-untied"
    return "lstm"


def build_model(config: DemoModel) -> nn.Module:
    """A fresh model of shape ``config``, initialised from torch's global RNG."""
    return GPT(config) if isinstance(config, GPTConfig) else WordLM(config)


def describe_model(config: DemoModel, parameters: int) -> str:
    """One line: the model, its size and its largest matrices."""
    m = config
    if isinstance(m, GPTConfig):
        head = (
            "head tied to the embedding"
            if m.tied
            else f"head {m.dim}x{m.vocab_size} (untied: the embedding's gradient is row-sparse)"
        )
        return (
            f"GPT-2-style transformer LM, {parameters / 1e6:.2f} M parameters (embedding "
            f"{m.vocab_size}x{m.dim}, {m.layers} blocks of width {m.dim}, {m.heads} heads, "
            f"context {m.context}, {head})"
        )
    return (
        f"word-level LSTM LM, {parameters / 1e6:.2f} M parameters (embedding "
        f"{m.vocab_size}x{m.emb_dim}, LSTM {m.layers}x{m.hidden}, output "
        f"{m.hidden}x{m.vocab_size})"
    )
