"""``decode_sum``'s divisor on the C backend: a power-of-two divisor is applied as a multiply
by its reciprocal (exact where the reciprocal is a normal float), any other divisor as a divide;
either way bit-identical to the reference interpreter, down to subnormal results."""

from __future__ import annotations

import pytest
import torch
from test_native import same_values

from hipress.compll import load

# dense decodes (the tiled decode_sum) and one sparse one
NAMES = ("onebit", "int8", "tbq", "qsgd", "fp16", "bf16", "signsgd", "terngrad", "topk")
# powers of two with a normal reciprocal (multiplied), and others (divided): 2^127's
# reciprocal is subnormal, 2^-127 is itself subnormal
DIVISORS = (1.0, 2.0, 4.0, 2.0**-3, 2.0**126, 2.0**-126, 2.0**127, 2.0**-127, 3.0)


@pytest.mark.parametrize("name", NAMES)
def test_decode_sum_divisors_match_reference(name: str) -> None:
    n = 5003  # crosses tiles, ends in a partial one
    ref, cpu = load(name, backend="reference"), load(name, backend="cpu")
    gen = torch.Generator().manual_seed(3)
    payloads = []
    s_ref = ref.init_state(n, seed=5)
    for scale in (1.0, 1e-36, 3e37):  # ordinary, near-subnormal and near-maximal values
        x = torch.randn(n, generator=gen) * scale
        payloads.append(ref.encode(x, s_ref))
    for div in DIVISORS:
        want = ref.decode_sum(payloads, n, divide_by=div)
        got = cpu.decode_sum(payloads, n, divide_by=div)
        assert same_values(want, got), f"{name}: decode_sum / {div!r} differs from the reference"
