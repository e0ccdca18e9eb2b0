"""``hipress bench costfit``: which form of cost function predicts encode/decode time best.

Times encode/decode of a few CompLL algorithms at half-octave sizes (one thread), fits both
cost forms of :mod:`hipress.secopa.model.costfn` (piecewise-linear and affine-with-floor) on every
other size and prints their errors on the held-out sizes; writes ``hipress-results/costfit.json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from hipress.bench.provenance import stamp
from hipress.bench.report import write_json

__all__ = ["FIT_ALGORITHMS", "fit_study"]

FIT_ALGORITHMS = (("terngrad", {"bitwidth": 2}), ("onebit", {}), ("fp16", {}))


def fit_study(out_path: str, budget_s: float, command: str) -> int:
    """Held-out error of the piecewise-linear and affine-with-floor fits; prints a table."""
    import torch

    from hipress.secopa.measure.profiler import measure_compute
    from hipress.secopa.measure.timed_codec import load_timed_codec
    from hipress.secopa.model.costfn import fit_affine_floor, fit_piecewise

    torch.set_num_threads(1)
    sizes = [int(2 ** (e / 2)) for e in range(16, 45)]  # 256 .. 4M elements
    rows: list[dict[str, Any]] = []
    print(f"{'algorithm':<10}{'op':<8}{'form':<14}{'median err':>11}{'max err':>9}")
    for name, params in FIT_ALGORITHMS:
        samples = measure_compute(load_timed_codec(name, params), sizes=sizes, budget_s=budget_s)
        for op in ("encode", "decode"):
            x, t = (np.asarray(v) for v in samples.samples[op])
            train, test = slice(0, None, 2), slice(1, None, 2)
            for form, fit in (("piecewise", fit_piecewise), ("affine_floor", fit_affine_floor)):
                f = fit(x[train], t[train])
                err = np.abs(f(x[test]) - t[test]) / t[test]
                row = {"algorithm": name, "op": op, "form": form, "sizes": len(x),
                       "median_error": float(np.median(err)), "max_error": float(err.max())}  # fmt: skip
                rows.append(row)
                print(f"{name:<10}{op:<8}{form:<14}{row['median_error']:>11.3f}"
                      f"{row['max_error']:>9.2f}")  # fmt: skip
    path = Path(out_path)
    write_json(stamp({"benchmark": "costfit", "rows": rows}, command), path)
    print(f"results written to {path}")
    return 0
