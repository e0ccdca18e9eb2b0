"""Validate SeCoPa against measurements (``hipress bench plan``), and compare cost-function forms.

    python bench/bench_plan.py --model mlp --algorithm terngrad --param bitwidth=2 \
        --nproc 2 --rate-mbit 1000 --steps 5

profiles in a local gloo group, plans, then runs CaSync with SeCoPa's plan, all-uncompressed
and all-compressed, and prints measured against predicted sync time per step; writes
``bench/results/bench_plan.json`` (see hipress/secopa/validate.py and docs/secopa.md).

    python bench/bench_plan.py --fit-study

times encode/decode of a few CompLL algorithms at half-octave sizes (one thread), fits both
cost forms on every other size and prints their errors on the held-out sizes; writes
``bench/results/bench_costfit.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import numpy as np

from hipress.secopa.validate import add_arguments, run_bench

FIT_ALGORITHMS = (("terngrad", {"bitwidth": 2}), ("onebit", {}), ("fp16", {}))


def fit_study(out_path: str, budget_s: float) -> int:
    """Held-out error of the piecewise-linear and affine-with-floor fits; prints a table."""
    import torch

    from hipress.secopa.codec import load_codec
    from hipress.secopa.costfn import fit_affine_floor, fit_piecewise
    from hipress.secopa.profiler import measure_compute

    torch.set_num_threads(1)
    sizes = [int(2 ** (e / 2)) for e in range(16, 45)]  # 256 .. 4M elements
    rows = []
    print(f"{'algorithm':<10}{'op':<8}{'form':<14}{'median err':>11}{'max err':>9}")
    for name, params in FIT_ALGORITHMS:
        samples = measure_compute(load_codec(name, params), sizes=sizes, budget_s=budget_s)
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
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows, indent=2))
    print(f"results written to {path}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    parser.add_argument("--fit-study", action="store_true", help="compare cost-function forms")
    logging.basicConfig(level=logging.WARNING)
    args = parser.parse_args()
    if args.fit_study:
        return fit_study("bench/results/bench_costfit.json", max(args.budget, 8.0))
    return run_bench(args)


if __name__ == "__main__":
    raise SystemExit(main())
