"""hipress.bench.traffic: the reads of the gradient an encode cannot avoid (the roofline's)."""

from __future__ import annotations

import pytest

from hipress.bench.traffic import grad_reads
from hipress.compll import load


@pytest.mark.parametrize(
    ("name", "reads"),
    [
        ("terngrad", 2),  # min and max of all of g, then every element of g again
        ("onebit", 1),  # its sums go to the payload: no element waits for them
        ("qsgd", 1),  # per-bucket norms: a segment fits a cache
        ("randomk", 1),  # its NaN flag is added to the k gathered values only
        ("topk", 1),
        ("signsgd", 1),
    ],
)
def test_grad_reads(name: str, reads: int) -> None:
    assert grad_reads(load(name, backend="reference").program) == reads
