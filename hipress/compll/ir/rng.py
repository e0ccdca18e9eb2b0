"""The counter-based random number generator every backend shares: Philox4x32-10.

A random number is a pure function of (seed, step, tensor id, stream, element counter), so the
reference interpreter, the C kernels and the CUDA kernels draw identical numbers in any order.

Definition (all arithmetic mod 2**32)::

    counter = (c >> 2, ((c >> 34) & 0xFFFF) | (stream << 16), step, tensor_id)
    key     = (seed & 0xFFFFFFFF, seed >> 32)
    out     = philox4x32_10(counter, key)[c & 3]

    round: (hi0, lo0) = mulhilo(0xD2511F53, x0); (hi1, lo1) = mulhilo(0xCD9E8D57, x2)
           x = (hi1 ^ x1 ^ k0, lo1, hi0 ^ x3 ^ k1, lo0)
    10 rounds; after each of the first 9: k0 += 0x9E3779B9, k1 += 0xBB67AE85.

``uniform`` = (out >> 8) * 2**-24, an f32 in [0, 1).
"""

from __future__ import annotations

import torch

M0 = 0xD2511F53
M1 = 0xCD9E8D57
W0 = 0x9E3779B9
W1 = 0xBB67AE85
MASK32 = 0xFFFFFFFF
ROUNDS = 10


def _mulhilo(m: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # x < 2**32 and m < 2**32: the 64-bit product wraps in int64 but keeps its bit pattern.
    p = x * m
    return (p >> 32) & MASK32, p & MASK32


def philox_bits(
    counter: torch.Tensor, stream: int, step: int, tensor_id: int, seed: int
) -> torch.Tensor:
    """Raw u32 random bits (as int64 values in [0, 2**32)) for each int64 ``counter``."""
    c = counter.to(torch.int64)
    x0 = (c >> 2) & MASK32
    x1 = ((c >> 34) & 0xFFFF) | ((stream & 0xFFFF) << 16)
    x2 = torch.full_like(c, step & MASK32)
    x3 = torch.full_like(c, tensor_id & MASK32)
    k0 = seed & MASK32
    k1 = (seed >> 32) & MASK32
    for r in range(ROUNDS):
        hi0, lo0 = _mulhilo(M0, x0)
        hi1, lo1 = _mulhilo(M1, x2)
        x0, x1, x2, x3 = hi1 ^ x1 ^ k0, lo1, hi0 ^ x3 ^ k1, lo0
        if r < ROUNDS - 1:
            k0 = (k0 + W0) & MASK32
            k1 = (k1 + W1) & MASK32
    lane = c & 3
    out = torch.where(lane == 0, x0, x1)
    out = torch.where(lane == 2, x2, out)
    return torch.where(lane == 3, x3, out)


def uniform_from_bits(bits: torch.Tensor) -> torch.Tensor:
    """f32 in [0, 1): the top 24 of the 32 bits, scaled by 2**-24 (exact in f32)."""
    return (bits >> 8).to(torch.float32) * (1.0 / 16777216.0)
