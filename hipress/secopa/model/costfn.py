"""Cost functions of one size argument: time in ms as a function of elements (or bytes).

Two forms, both evaluated on scalars or numpy arrays and both JSON round-trippable:

- :class:`AffineFloor` -- the original SeCoPa form ``max(floor, w*x + b)``.
- :class:`PiecewiseLinear` -- linear interpolation between measured knots (non-decreasing by
  construction), the first knot's value below the first knot, linear extrapolation with the
  upper slope above the last knot. This is the default the profiler fits; see
  docs/explanation/secopa.md for why.

:func:`fit_affine_floor` and :func:`fit_piecewise` turn ``(sizes, times)`` samples into either.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray


class CostFnError(ValueError):
    """A cost function is malformed (bad JSON, negative costs, unsorted knots)."""


class CostFn(Protocol):
    """Time in ms of one operation as a function of its size (scalar or array)."""

    def __call__(self, x: ArrayLike) -> NDArray[np.float64]: ...

    def to_dict(self) -> dict[str, Any]: ...

    def slope_bounds(self) -> tuple[float, float]:
        """(smallest, largest) derivative d cost / d size over all sizes > 0."""
        ...


@dataclass(frozen=True)
class AffineFloor:
    """``c(x) = max(floor, w*x + b)`` in ms, the original system's form.

    Fields:
        w: ms per unit of size (>= 0).
        b: intercept in ms (may be negative: the floor then dominates small sizes).
        floor: minimum cost in ms (>= 0).
    """

    w: float
    b: float
    floor: float = 0.0

    def __post_init__(self) -> None:
        if not (self.w >= 0 and self.floor >= 0 and np.isfinite(self.b)):
            raise CostFnError(f"affine-floor needs w >= 0, floor >= 0, finite b; got {self}")

    def __call__(self, x: ArrayLike) -> NDArray[np.float64]:
        return np.maximum(self.floor, self.w * np.asarray(x, dtype=np.float64) + self.b)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "affine_floor", "w": self.w, "b": self.b, "floor": self.floor}

    def slope_bounds(self) -> tuple[float, float]:
        return (0.0 if self.floor > self.b else self.w), self.w


@dataclass(frozen=True)
class PiecewiseLinear:
    """Linear interpolation through knots ``(x[i], t[i])``, non-decreasing.

    Fields:
        x: strictly increasing sizes (> 0).
        t: costs in ms at those sizes, non-decreasing, >= 0.
        slope: ms per unit above the last knot (>= 0).

    Below ``x[0]`` the cost is ``t[0]`` (the measured floor).
    """

    x: tuple[float, ...]
    t: tuple[float, ...]
    slope: float

    def __post_init__(self) -> None:
        x, t = np.asarray(self.x), np.asarray(self.t)
        if len(x) == 0 or len(x) != len(t):
            raise CostFnError("piecewise cost needs as many times as sizes, at least one")
        if np.any(np.diff(x) <= 0) or x[0] <= 0:
            raise CostFnError(f"piecewise knots must be positive and increasing: {self.x}")
        if np.any(np.diff(t) < 0) or t[0] < 0 or not self.slope >= 0:
            raise CostFnError("piecewise costs must be non-negative and non-decreasing")

    def __call__(self, x: ArrayLike) -> NDArray[np.float64]:
        xs = np.asarray(x, dtype=np.float64)
        inside = np.interp(xs, self.x, self.t)
        above = self.t[-1] + self.slope * (xs - self.x[-1])
        return np.where(xs > self.x[-1], above, inside)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "piecewise", "x": list(self.x), "t": list(self.t), "slope": self.slope}

    def slope_bounds(self) -> tuple[float, float]:
        seg = np.diff(self.t) / np.diff(self.x) if len(self.x) > 1 else np.zeros(0)
        all_slopes = [0.0, *seg.tolist(), self.slope]  # 0: flat below the first knot
        return min(all_slopes), max(all_slopes)


def costfn_from_dict(d: Mapping[str, Any]) -> CostFn:
    """Rebuild a cost function from :meth:`to_dict` output; raise :class:`CostFnError`."""
    try:
        kind = d["kind"]
        if kind == "affine_floor":
            return AffineFloor(float(d["w"]), float(d["b"]), float(d.get("floor", 0.0)))
        if kind == "piecewise":
            return PiecewiseLinear(
                tuple(float(v) for v in d["x"]),
                tuple(float(v) for v in d["t"]),
                float(d["slope"]),
            )
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, CostFnError):
            raise
        raise CostFnError(f"malformed cost function {dict(d)!r}: {exc}") from None
    raise CostFnError(f"unknown cost function kind {kind!r} (affine_floor, piecewise)")


def _check_samples(
    sizes: Sequence[float], times: Sequence[float]
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    x = np.asarray(sizes, dtype=np.float64)
    t = np.asarray(times, dtype=np.float64)
    if x.ndim != 1 or x.shape != t.shape or len(x) == 0:
        raise CostFnError("need equally many sizes and times, at least one")
    if np.any(x <= 0) or np.any(t < 0) or not np.all(np.isfinite(t)):
        raise CostFnError("sizes must be positive and times finite and non-negative")
    order = np.argsort(x, kind="stable")
    return x[order], t[order]


def _isotonic(t: NDArray[np.float64], w: NDArray[np.float64]) -> NDArray[np.float64]:
    """Weighted least-squares non-decreasing fit (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for v, wt in zip(t.tolist(), w.tolist(), strict=True):
        blocks.append([v, wt, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, c2 = blocks.pop()
            m1, w1, c1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, c1 + c2])
    return np.concatenate([np.full(int(c), m) for m, _, c in blocks])


def fit_piecewise(sizes: Sequence[float], times: Sequence[float]) -> PiecewiseLinear:
    """Fit a non-decreasing piecewise-linear cost through samples.

    Takes sizes (> 0) and times in ms (several samples per size allowed; they are averaged).
    Returns knots at the distinct sizes, made monotone by isotonic regression weighted by
    1/t^2 (relative error), extrapolated above the last knot with the least-squares slope
    of the last three knots, capped at ``t[-2] / x[-2]`` (robust to one slow top sample).
    """
    x, t = _check_samples(sizes, times)
    ux, inv = np.unique(x, return_inverse=True)
    ut = np.bincount(inv, weights=t) / np.bincount(inv)
    w = 1.0 / np.maximum(ut, 1e-9) ** 2
    mt = _isotonic(ut, w)
    # Above the last knot: the least-squares slope of the last three knots, but at most the
    # per-element cost at the second-largest knot, so one slow sample at the top cannot
    # inflate the extrapolation (that bound is >= the slope of any cost with an overhead).
    slope = float(mt[0] / ux[0])
    if len(ux) > 1:
        top_x, top_t = ux[-3:], mt[-3:]
        ls = float(np.polyfit(top_x, top_t, 1)[0])
        slope = min(ls, float(mt[-2] / ux[-2]))
    slope = max(slope, 0.0)
    return PiecewiseLinear(tuple(ux.tolist()), tuple(mt.tolist()), slope)


def fit_affine_floor(sizes: Sequence[float], times: Sequence[float]) -> AffineFloor:
    """Fit ``max(floor, w*x + b)`` to samples.

    The line is a least-squares fit in relative error (weights 1/t) over all samples, with
    ``w`` clamped to >= 0; the floor is the smallest measured time. Guarantees a valid
    :class:`AffineFloor`.
    """
    x, t = _check_samples(sizes, times)
    floor = float(t.min())
    if len(np.unique(x)) < 2:
        return AffineFloor(0.0, floor, floor)
    sw = 1.0 / np.maximum(t, 1e-9)
    a = np.stack([x * sw, sw], axis=1)
    (w, b), *_ = np.linalg.lstsq(a, t * sw, rcond=None)
    if w < 0:
        w, b = 0.0, float(np.average(t, weights=sw))
    return AffineFloor(float(w), float(b), floor)


def relative_error(fn: CostFn, sizes: Sequence[float], times: Sequence[float]) -> float:
    """Median absolute relative error of ``fn`` against samples (0.1 = 10%)."""
    x, t = _check_samples(sizes, times)
    pred = fn(x)
    return float(np.median(np.abs(pred - t) / np.maximum(t, 1e-9)))
