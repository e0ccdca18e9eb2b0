"""Cost functions: the affine-with-floor form, the piecewise-linear form and their fits."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hipress.secopa.model.costfn import (
    AffineFloor,
    CostFnError,
    PiecewiseLinear,
    costfn_from_dict,
    fit_affine_floor,
    fit_piecewise,
    relative_error,
)

SIZES = [float(4**i) for i in range(4, 12)]


def test_affine_floor_is_the_original_form() -> None:
    f = AffineFloor(w=2e-6, b=0.01, floor=0.05)
    assert f(0.0) == pytest.approx(0.05)  # the floor dominates small sizes
    assert f(1e6) == pytest.approx(2.01)
    np.testing.assert_allclose(f(np.array([10.0, 1e6])), [0.05, 2.01])


def test_piecewise_interpolates_and_extrapolates() -> None:
    f = PiecewiseLinear((10.0, 20.0), (1.0, 3.0), slope=0.5)
    assert f(5.0) == pytest.approx(1.0)  # flat below the first knot
    assert f(15.0) == pytest.approx(2.0)
    assert f(40.0) == pytest.approx(3.0 + 0.5 * 20)
    assert f.slope_bounds() == (0.0, 0.5)  # flat below, 0.2 between, 0.5 above


@pytest.mark.parametrize(
    "bad",
    [
        {"kind": "piecewise", "x": [2.0, 1.0], "t": [1.0, 2.0], "slope": 0.0},
        {"kind": "piecewise", "x": [1.0, 2.0], "t": [2.0, 1.0], "slope": 0.0},
        {"kind": "affine_floor", "w": -1.0, "b": 0.0},
        {"kind": "cubic"},
        {"kind": "affine_floor"},
    ],
)
def test_malformed_cost_functions_are_rejected(bad: dict[str, object]) -> None:
    with pytest.raises(CostFnError):
        costfn_from_dict(bad)


@given(
    w=st.floats(1e-7, 1e-3),
    b=st.floats(0.0, 0.5),
    floor=st.floats(0.0, 0.5),
)
def test_round_trip_through_dict(w: float, b: float, floor: float) -> None:
    for f in (AffineFloor(w, b, floor), fit_piecewise(SIZES, [w * x + b for x in SIZES])):
        g = costfn_from_dict(f.to_dict())
        np.testing.assert_allclose(g(np.array(SIZES)), f(np.array(SIZES)))


@settings(deadline=None)
@given(w=st.floats(1e-7, 1e-4), b=st.floats(1e-3, 0.1), noise=st.floats(0.0, 0.03))
def test_fits_recover_an_affine_cost(w: float, b: float, noise: float) -> None:
    rng = np.random.default_rng(0)
    truth = np.array([w * x + b for x in SIZES])
    noisy = truth * (1 + noise * rng.uniform(-1, 1, len(SIZES)))
    af = fit_affine_floor(SIZES, noisy)
    pw = fit_piecewise(SIZES, noisy)
    assert relative_error(af, SIZES, truth) < 2 * noise + 1e-6
    assert relative_error(pw, SIZES, truth) < 2 * noise + 1e-6
    # extrapolation stays within the noise of the per-element cost at the top
    big = SIZES[-1] * 16
    assert pw(big) == pytest.approx(w * big + b, rel=0.05 + 2 * noise)


@given(st.lists(st.floats(0.0, 10.0), min_size=2, max_size=10))
def test_piecewise_fit_is_monotone_even_on_noise(times: list[float]) -> None:
    sizes = [float(2**i) for i in range(1, len(times) + 1)]
    f = fit_piecewise(sizes, times)
    grid = np.geomspace(1.0, sizes[-1] * 8, 200)
    assert np.all(np.diff(f(grid)) >= -1e-12)
    lo, hi = f.slope_bounds()
    assert 0.0 <= lo <= hi


def test_piecewise_fit_ignores_one_slow_outlier_at_the_top() -> None:
    times = [1e-6 * x + 1e-3 for x in SIZES]
    times[-1] *= 10  # one slow sample (a descheduled thread)
    f = fit_piecewise(SIZES, times)
    # the extrapolation slope is capped by the per-element cost of the knot below the outlier
    assert 1e-6 <= f.slope <= times[-2] / SIZES[-2]


def test_fits_reject_bad_samples() -> None:
    with pytest.raises(CostFnError):
        fit_piecewise([1.0, 2.0], [1.0])
    with pytest.raises(CostFnError):
        fit_affine_floor([0.0, 2.0], [1.0, 2.0])
