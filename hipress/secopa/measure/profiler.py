"""The profiler: measures a :class:`~hipress.secopa.model.profile.Profile` on this machine.

- :func:`measure_compute` times a codec's encode and decode and a float32 merge at a handful of
  sizes, adaptively, within a time budget (one process, no process group needed).
- :func:`fit_payload` fits the payload size model from ``payload_nbytes``.
- :func:`build_profile` assembles a profile from these and a network: measured by
  :mod:`hipress.secopa.measure.netprofiler` (collectives and overlap, in a process group), or a
  user-given link.
"""

from __future__ import annotations

import logging
import platform
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hipress.secopa.measure.timed_codec import TimedCodec
from hipress.secopa.model.costfn import fit_affine_floor, fit_piecewise, relative_error
from hipress.secopa.model.profile import COMPUTE_OPS, CommOp, PayloadModel, Profile, ProfileError
from hipress.timing import ms_per_call

log = logging.getLogger(__name__)

DEFAULT_COMPUTE_SIZES = tuple(4**i for i in range(4, 12))  # 256 .. 4M elements

Samples = Mapping[str, tuple[tuple[float, ...], tuple[float, ...]]]


@dataclass(frozen=True)
class ComputeSamples:
    """Median ms per call for each compute op at each measured size."""

    samples: Samples  # op -> (sizes, ms)


def measure_compute(
    codec: TimedCodec,
    sizes: Sequence[int] = DEFAULT_COMPUTE_SIZES,
    budget_s: float = 1.5,
    max_reps: int = 25,
    max_size: int | None = None,
    stat: str = "median",
) -> ComputeSamples:
    """Time encode, decode (and decode_acc, decode_sum2 if the codec has them) of ``codec`` and a float32
    merge at increasing sizes within about ``budget_s``.

    ``max_size`` (e.g. the model's largest tensor) replaces the sizes above it by itself.
    Each size is prepared once (buffers allocated outside the timing); each op runs once to
    warm up, then 2..max_reps more times (as many as its share of the budget allows), and the
    ``stat`` of those is kept: ``median`` (default: the typical cost under the machine's
    current load, which is what a training step will see) or ``min`` (the most repeatable
    figure on a quiet machine). A larger size is skipped when its expected time (the last
    size's, scaled by the size ratio) would overrun the budget. Always measures at least two
    sizes.
    """
    if stat not in ("median", "min"):
        raise ProfileError(f"stat must be 'median' or 'min', got {stat!r}")
    grid = sorted(set(sizes))
    if max_size is not None:
        grid = [s for s in grid if s < max_size] + [max_size]
    if len(grid) < 2:
        raise ProfileError(f"measure_compute needs at least two sizes, got {grid}")
    deadline = time.perf_counter() + budget_s
    offered = codec.prepare(1)
    ops = [*COMPUTE_OPS, *(op for op in ("decode_acc", "decode_sum2") if op in offered)]
    share = budget_s / len(grid) / len(ops)
    got: dict[str, tuple[list[float], list[float]]] = {op: ([], []) for op in ops}
    device = getattr(codec, "device", None)  # None: the CPU
    prev_n, prev_s = 0, 0.0
    for i, n in enumerate(grid):
        expect = prev_s * n / prev_n if prev_n else 0.0
        if i >= 2 and time.perf_counter() + expect > deadline:
            log.info("compute budget spent; stopping before %d elements", n)
            break
        t_size = time.perf_counter()
        thunks = dict(codec.prepare(n))
        acc = torch.zeros(n, dtype=torch.float32, device=device)
        inc = torch.ones(n, dtype=torch.float32, device=device)
        thunks["merge"] = lambda a=acc, b=inc: a.add_(b)
        for op in ops:
            first = ms_per_call(thunks[op], 1, device=device)
            reps = max(2, min(max_reps, int(share * 1e3 / max(first, 1e-3))))
            got[op][0].append(float(n))
            got[op][1].append(ms_per_call(thunks[op], reps, stat, device))
        prev_n, prev_s = n, time.perf_counter() - t_size
    return ComputeSamples({op: (tuple(x), tuple(t)) for op, (x, t) in got.items()})


def fit_payload(codec: TimedCodec) -> PayloadModel:
    """Least-squares line through ``payload_nbytes(n)`` for n = 2^10 .. 2^24.

    The header is the mean excess over the slope, clipped at 0; the model is within the
    codec's rounding (a few bytes) of the real size for n >= 1024.
    """
    ns = np.array([1 << e for e in range(10, 25)], dtype=np.float64)
    ps = np.array([codec.payload_nbytes(int(n)) for n in ns], dtype=np.float64)
    if np.any(ps <= 0):
        raise ProfileError(f"{codec.name}: payload_nbytes must be positive")
    bpe = float((ps[-1] - ps[-5]) / (ns[-1] - ns[-5]))
    header = max(0.0, float(np.mean(ps - bpe * ns)))
    return PayloadModel(bpe, header)


def build_profile(
    codec: TimedCodec,
    compute: ComputeSamples,
    network: Mapping[str, CommOp],
    overlap: float = 1.0,
    form: str = "piecewise",
    meta: Mapping[str, Any] | None = None,
) -> Profile:
    """Assemble a profile: compute costs fitted in ``form`` (``piecewise`` or
    ``affine_floor``), the codec's payload model, the given network ops. The fit errors of
    both forms are recorded in ``meta["fit_error"]``."""
    if form not in ("piecewise", "affine_floor"):
        raise ProfileError(f"unknown cost form {form!r} (piecewise, affine_floor)")
    fns = {}
    errors: dict[str, dict[str, float]] = {}
    for op, (xs, ts) in compute.samples.items():
        pw, af = fit_piecewise(xs, ts), fit_affine_floor(xs, ts)
        fns[op] = pw if form == "piecewise" else af
        errors[op] = {
            "piecewise": round(relative_error(pw, xs, ts), 4),
            "affine_floor": round(relative_error(af, xs, ts), 4),
        }
    info: dict[str, Any] = {
        "host": platform.node(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "form": form,
        "fit_error": errors,
        "compute_samples": {op: [list(x), list(t)] for op, (x, t) in compute.samples.items()},
    }
    info.update(meta or {})
    checks = getattr(codec, "checks_finite", None)
    return Profile(
        algorithm=codec.name,
        params=dict(codec.params),
        payload=fit_payload(codec),
        compute=fns,
        network=dict(network),
        overlap=overlap,
        meta=info,
        encode_checks_finite=bool(checks()) if checks is not None else False,
    )
