"""Finite gradients near the float32 maximum: no algorithm makes them non-finite without
setting the non-finite flag, alike on the reference, C and emulated CUDA backends. terngrad
keeps a gradient spanning more than the largest float finite; the f16/bf16 casts, whose
overflow to infinity is their documented behaviour, flag the values they overflow."""

from __future__ import annotations

import pytest
import torch
from test_native import same_values

from hipress.compll import Algorithm, load
from hipress.compll.backends.cuda.emu import emulated_backend

BIG = 3.0e38  # hi - lo = 6e38 overflows float32


def _backends(name: str, **params: object) -> list[Algorithm]:
    ref = load(name, backend="reference", **params)
    emu = Algorithm(ref.program, emulated_backend(ref.program, blocks=None))
    return [ref, load(name, backend="cpu", **params), emu]


def _run(a: Algorithm, x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    payload, bad = a.encode_checked(x, a.init_state(x.numel(), seed=4))
    return a.decode(payload, x.numel()), bool(bad)


@pytest.mark.parametrize("params", [{}, {"bitwidth": 1, "clip": 0.0}, {"bitwidth": 8}])
def test_terngrad_keeps_a_gradient_wider_than_the_float_range_finite(params: dict) -> None:
    x = torch.tensor([BIG, -BIG, 1.0, 0.0, -2e38, 1e38, 3.4028234e38, -3.4028234e38] * 9)
    outs = [_run(a, x) for a in _backends("terngrad", **params)]
    want, _ = outs[0]
    assert bool(torch.isfinite(want).all()), want
    assert want.max() > 1e38 and want.min() < -1e38  # the levels still span the range
    for got, bad in outs:
        assert not bad
        assert same_values(want, got)


@pytest.mark.parametrize(("name", "edge"), [("fp16", 65520.0), ("bf16", 1.99609375 * 2.0**127)])
def test_casts_flag_the_finite_values_they_overflow(name: str, edge: float) -> None:
    below = torch.nextafter(torch.tensor(edge), torch.tensor(0.0)).item()
    for a in _backends(name):
        out, bad = _run(a, torch.tensor([1.0, -below, below]))
        assert not bad and bool(torch.isfinite(out).all()), a.backend
        for v in (edge, -edge, 3.4e38):
            out, bad = _run(a, torch.tensor([1.0, v, 2.0]))
            assert bad, f"{name} on {type(a.backend).__name__}: {v} sent as {out[1]}, unflagged"
            assert not bool(torch.isfinite(out).all())  # (the cast's result is unchanged)
