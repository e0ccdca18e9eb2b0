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


RING_WORLDS = (2, 3, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
RING_BITS_PER_S = (1e8, 1e9, 1e10, 2.5e10, 1e11)
RING_SIZES = tuple(1 << e for e in range(10, 29))  # 1K .. 256M elements


def _ring_formula(every_hop: bool):  # type: ignore[no-untyped-def]
    """The original's compressed Ring verbatim, or with the compute a compressed ring does.

    Verbatim: ``2(N-1) send(r m/K) + N enc(m/K) + N dec(r m/K) + (N-1) merge(m/K)`` (decode
    costed at the payload's size in float32 elements, as the original's fits were). With
    ``every_hop``: each of the N-1 reduce-scatter hops decodes, merges and re-encodes the chunk
    it received and each of the N-1 all-gather hops decodes one, so ``N enc(m/K) + 2(N-1)
    dec(m/K) + (N-1) merge(m/K)``, decode costed at the elements it produces (what a measured
    ``decode(n)`` means). Both keep the original's ``"sum"``: hops are not pipelined.
    """
    import dataclasses

    from hipress.secopa.formulas import ORIGINAL_FORMULAS, Term

    ring = next(f for f in ORIGINAL_FORMULAS if f.name == "ring_compressed")
    if not every_hop:
        return ring
    compute = tuple(
        Term("decode", lambda d: 2.0 * (d.n - 1), lambda d: d.part) if t.op == "decode" else t
        for t in ring.compute
    )
    return dataclasses.replace(ring, name="ring_compressed_every_hop", compute=compute)


def ring_study(profile_paths: list[str], out_path: str, latency_s: float) -> int:
    """Is the original's compressed Ring ever predicted faster than CaSync's PS and allgather?

    For each measured profile (compute costs of one algorithm), each world size, link
    bandwidth and tensor size: the best K of each strategy; prints where Ring wins and writes
    ``bench/results/bench_plan_ring.json``.
    """
    from hipress.secopa.costmodel import CASYNC_FORMULAS, CostModel
    from hipress.secopa.profile import Profile

    ring_verbatim, ring_decoded = _ring_formula(False), _ring_formula(True)
    ps, ag = (f for f in CASYNC_FORMULAS if f.name in ("ps", "allgather"))
    result: dict[str, object] = {"latency_s": latency_s, "algorithms": {}}
    for path in profile_paths:
        base = Profile.load(path)
        rows = []
        for overlap in (0.0, base.overlap):
            for bits in RING_BITS_PER_S:
                prof = base.with_link(bits / 8, latency_s, overlap=overlap)
                for n in RING_WORLDS:
                    cm = CostModel(prof, n, (ps, ag, ring_verbatim, ring_decoded))
                    for m in RING_SIZES:
                        t = {name: float(np.min(cm.times(name, m))) for name in cm.formulas}
                        casync = min(t["ps"], t["allgather"])
                        rows.append({"overlap": overlap, "bits_per_s": bits, "n": n, "m": m,
                                     **{k: round(v, 6) for k, v in t.items()},
                                     "ring_wins": t["ring_compressed"] < casync,
                                     "ring_every_hop_wins": t["ring_compressed_every_hop"] < casync,
                                     "ring_over_best": t["ring_compressed"] / casync})  # fmt: skip
        name = base.algorithm
        summary = {}
        for variant in ("ring_compressed", "ring_compressed_every_hop"):
            for ov in sorted({r["overlap"] for r in rows}):
                mine = [r for r in rows if r["overlap"] == ov]
                wins = [r for r in mine if r[variant] < min(r["ps"], r["allgather"])]
                ratio = [r[variant] / min(r["ps"], r["allgather"]) for r in mine]
                i = int(np.argmin(ratio))
                at = mine[i]
                s = {
                    "cases": len(mine),
                    "wins": len(wins),
                    "worlds": sorted({r["n"] for r in wins}),
                    "bits_per_s": sorted({r["bits_per_s"] for r in wins}),
                    "sizes": [min(r["m"] for r in wins), max(r["m"] for r in wins)] if wins else [],
                    "wins_at_n2_3": sum(r["n"] <= 3 for r in wins),
                    "wins_at_n_ge_64": sum(r["n"] >= 64 for r in wins),
                    "best_ratio": round(ratio[i], 3),
                    "best_at": {"n": at["n"], "bits_per_s": at["bits_per_s"], "m": at["m"]},
                }
                summary[f"{variant}@overlap={ov}"] = s
                print(f"{name:<9}{variant:<26} overlap {ov:.1f}: Ring faster in "
                      f"{s['wins']:>4} of {s['cases']} (N=2-3: {s['wins_at_n2_3']}, "
                      f"N>=64: {s['wins_at_n_ge_64']}); best ring/min(ps,ag) "
                      f"{s['best_ratio']:.2f} at N={at['n']}, {at['bits_per_s']:.0e} bit/s, "
                      f"m={at['m']}")  # fmt: skip
        result["algorithms"][name] = {"profile": base.to_dict(), "summary": summary}  # type: ignore[index]
    path = Path(out_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    print(f"results written to {path}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    parser.add_argument("--fit-study", action="store_true", help="compare cost-function forms")
    parser.add_argument(
        "--ring-study",
        nargs="+",
        metavar="PROFILE",
        help="profiles (hipress profile --out): is the original's compressed Ring ever "
        "predicted faster than PS and allgather?",
    )
    logging.basicConfig(level=logging.WARNING)
    args = parser.parse_args()
    if args.ring_study:
        return ring_study(args.ring_study, "bench/results/bench_plan_ring.json", 25e-6)
    if args.fit_study:
        return fit_study("bench/results/bench_costfit.json", max(args.budget, 8.0))
    return run_bench(args)


if __name__ == "__main__":
    raise SystemExit(main())
