"""The demo: local worker processes train a language model (a word-level LSTM, or a GPT-2-style
transformer: :mod:`~hipress.demo.models`) on the Python standard library's own source,
uncompressed and with hipress, and compare (``hipress demo``).

    from hipress.demo import DemoConfig, default_runs, load_corpus, run_demo
    config = DemoConfig(steps=100)
    result = run_demo(config, default_runs("topk"), load_corpus(config.model.vocab_size))
    print(result.runs[1].final.accuracy, result.runs[1].ratio)

Stages: :mod:`~hipress.demo.data` (corpus), :mod:`~hipress.demo.wordlm` (the LSTM),
:mod:`~hipress.demo.models` (the models by name), :mod:`~hipress.demo.launch` (worker
processes), :mod:`~hipress.demo.train` (the runs), :mod:`hipress.cli.demo` (the command and its
output). See docs/reference/demo.md.
"""

from __future__ import annotations

from hipress.demo.config import (
    DemoConfig,
    DemoError,
    DemoResult,
    EvalPoint,
    RunResult,
    RunSpec,
    default_runs,
)
from hipress.demo.data import Corpus, DataError, Vocab, load_corpus
from hipress.demo.train import run_demo
from hipress.demo.wordlm import ModelConfig, WordLM

__all__ = [
    "Corpus",
    "DataError",
    "DemoConfig",
    "DemoError",
    "DemoResult",
    "EvalPoint",
    "ModelConfig",
    "RunResult",
    "RunSpec",
    "Vocab",
    "WordLM",
    "default_runs",
    "load_corpus",
    "run_demo",
]
