"""Shared pieces of the CaSync tests: which algorithms they cover and how to build them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from hipress.compll import Algorithm, algorithms, load

# error feedback (onebit), random numbers (terngrad), both plus momentum (dgc)
STATEFUL = ["onebit", "terngrad", "dgc"]


def algorithm_names() -> list[str]:
    """Every shipped CompLL algorithm."""
    return algorithms()


def make_algorithm(name: str) -> Algorithm:
    """The algorithm ``name`` with its default parameters (the same on every rank)."""
    return load(name)


@contextmanager
def single_thread() -> Iterator[None]:
    """Run torch on one thread, like the workers (float reductions depend on the split)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
