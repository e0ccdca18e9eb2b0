"""The tasks of ``hipress bench convergence`` as one rank runs them (:data:`RUNNERS`): how it
builds the model and its windows or samples from the task's data (``setup``), the loss of a
batch (``loss``) and rank 0's evaluation (``evaluate``: accuracy and loss on held-out data).

Tasks: ``lm``, the word-level LSTM LM (:class:`~hipress.bench.workloads.LSTMLM`); ``gpt`` and
``gpt-untied``, the GPT-2-style LM (:class:`~hipress.bench.gpt.GPT`, 4 blocks of width 128,
context the window) with tied or untied embeddings, on the same corpus; ``tabular``, the MLP
classifier on the synthetic teacher-student task.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import nn

from hipress.bench.convergence_options import ConvergenceOptions
from hipress.bench.gpt import GPT, GPTConfig, lm_loss
from hipress.bench.workloads import LSTMLM, TabularMLP

__all__ = ["RUNNERS", "Runner", "lm_windows"]


class Runner(NamedTuple):
    """A task's three functions: ``setup(data, opts, seed)`` returns ``{"model", "train",
    "valid"}`` (the model seeded by ``seed``; ``train`` indexable by a tensor of sample
    indices); ``loss(model, batch)`` the mean loss of a batch of ``train``; ``evaluate(model,
    valid)`` the (accuracy, mean loss) on ``valid``."""

    setup: Callable[[dict[str, Any], ConvergenceOptions, int], dict[str, Any]]
    loss: Callable[[nn.Module, torch.Tensor], torch.Tensor]
    evaluate: Callable[[Any, torch.Tensor], tuple[float, float]]


def lm_windows(ids: torch.Tensor, window: int) -> torch.Tensor:
    """Non-overlapping windows of ``window + 1`` tokens of ``ids`` (inputs and next-token
    targets), shaped (windows, window + 1)."""
    n = (len(ids) - 1) // window
    return ids[: n * window + 1].unfold(0, window + 1, window)


def _lm_setup(data: dict[str, Any], opts: ConvergenceOptions, seed: int) -> dict[str, Any]:
    w = opts.window()
    torch.manual_seed(seed)
    model = LSTMLM(data["vocab"], emb=128, hidden=256, layers=1, cutoffs=(1000, 4000))
    return {"model": model, "train": lm_windows(data["train"], w),
            "valid": lm_windows(data["valid"], w)}  # fmt: skip


def _lm_loss(ddp: nn.Module, chunk: torch.Tensor) -> torch.Tensor:
    return ddp(chunk[:, :-1], chunk[:, 1:])  # type: ignore[no-any-return]


@torch.no_grad()
def _lm_eval(model: LSTMLM, windows: torch.Tensor) -> tuple[float, float]:
    correct = total = 0
    loss_sum = 0.0
    for chunk in windows.split(64):
        x, y = chunk[:, :-1], chunk[:, 1:]
        correct += int((model.predict(x) == y).sum())
        loss_sum += float(model(x, y)) * y.numel()
        total += y.numel()
    return correct / total, loss_sum / total


def _gpt_setup(tied: bool) -> Callable[[dict[str, Any], ConvergenceOptions, int], dict[str, Any]]:
    def setup(data: dict[str, Any], opts: ConvergenceOptions, seed: int) -> dict[str, Any]:
        w = opts.window()
        torch.manual_seed(seed)
        model = GPT(GPTConfig(vocab_size=data["vocab"], context=w, tied=tied))
        return {"model": model, "train": lm_windows(data["train"], w),
                "valid": lm_windows(data["valid"], w)}  # fmt: skip

    return setup


def _gpt_loss(ddp: nn.Module, chunk: torch.Tensor) -> torch.Tensor:
    return lm_loss(ddp(chunk[:, :-1]), chunk[:, 1:])


@torch.no_grad()
def _gpt_eval(model: GPT, windows: torch.Tensor) -> tuple[float, float]:
    correct = total = 0
    loss_sum = 0.0
    for chunk in windows.split(64):
        x, y = chunk[:, :-1], chunk[:, 1:]
        logits = model(x)
        correct += int((logits.argmax(-1) == y).sum())
        loss_sum += float(lm_loss(logits, y)) * y.numel()
        total += y.numel()
    return correct / total, loss_sum / total


def _tab_setup(data: dict[str, Any], opts: ConvergenceOptions, seed: int) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = TabularMLP(data["features"], data["classes"])
    train = torch.cat([data["train_x"], data["train_y"][:, None].float()], 1)
    valid = torch.cat([data["valid_x"], data["valid_y"][:, None].float()], 1)
    return {"model": model, "train": train, "valid": valid}


def _tab_loss(ddp: nn.Module, chunk: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(ddp(chunk[:, :-1]), chunk[:, -1].long())


@torch.no_grad()
def _tab_eval(model: TabularMLP, valid: torch.Tensor) -> tuple[float, float]:
    logits, y = model(valid[:, :-1]), valid[:, -1].long()
    acc = float((logits.argmax(1) == y).float().mean())
    return acc, float(nn.functional.cross_entropy(logits, y))


RUNNERS: dict[str, Runner] = {
    "lm": Runner(_lm_setup, _lm_loss, _lm_eval),
    "gpt": Runner(_gpt_setup(True), _gpt_loss, _gpt_eval),
    "gpt-untied": Runner(_gpt_setup(False), _gpt_loss, _gpt_eval),
    "tabular": Runner(_tab_setup, _tab_loss, _tab_eval),
}
