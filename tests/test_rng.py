"""Philox4x32-10: known-answer vectors and the counter layout."""

from __future__ import annotations

import torch

from hipress.compll.ir.rng import philox_bits, uniform_from_bits


def test_random123_known_answers() -> None:
    # Random123 kat_vectors: philox4x32 10 rounds, counter 0 / key 0 and all-ones.
    zero = philox_bits(torch.arange(4), stream=0, step=0, tensor_id=0, seed=0)
    assert [int(v) for v in zero] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]


def test_all_ones_known_answer() -> None:
    # counter (ffffffff x4), key (ffffffff, ffffffff): counter word 0 = c >> 2 must be all ones,
    # word 1 = (c >> 34) | stream << 16, step and tensor id all ones.
    c = torch.tensor([((1 << 32) - 1) << 2 | lane for lane in range(4)], dtype=torch.int64)
    c = c | (0xFFFF << 34)
    out = philox_bits(c, stream=0xFFFF, step=0xFFFFFFFF, tensor_id=0xFFFFFFFF, seed=(1 << 64) - 1)
    assert [int(v) for v in out] == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]


def test_inputs_select_independent_streams() -> None:
    c = torch.arange(1024)
    base = philox_bits(c, 0, 0, 0, 0)
    for kw in ({"stream": 1}, {"step": 1}, {"tensor_id": 1}, {"seed": 1}, {"seed": 1 << 32}):
        args = {"stream": 0, "step": 0, "tensor_id": 0, "seed": 0, **kw}
        other = philox_bits(c, **args)
        assert (other == base).float().mean() < 0.01


def test_uniform_range_and_resolution() -> None:
    bits = torch.tensor([0, 255, 256, (1 << 32) - 1], dtype=torch.int64)
    u = uniform_from_bits(bits)
    assert u.dtype == torch.float32
    assert u.tolist() == [0.0, 0.0, 2.0**-24, 1.0 - 2.0**-24]
