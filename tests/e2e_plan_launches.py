"""Launches of `hipress bench e2e`'s hipress rows with ``plan="auto"``: how often SeCoPa makes
the same plan from one launch to the next.

Each launch is a fresh set of worker processes on the benchmark's network (each in its own
namespace with a shaped NIC, as in ``hipress bench e2e``): they measure the network, the
kernels and the ready times, calibrate, count the embedding's rows and plan, all from nothing.
Reports, per algorithm, how many launches gave the most common plan (:meth:`Plan.digest`), with
each launch's plan digest, selection and throughput:

    python tests/e2e_plan_launches.py --workers 2 --bandwidth 1gbit --model lstm-lm \\
        --algorithms onebit,topk --launches 10 [--json FILE]

Needs what ``hipress bench e2e`` needs (root for the namespaces; ``--bandwidth loopback`` runs
without).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from typing import Any


def launches(workers: int, rate_mbit: float | None, model: str, algorithm: str, n: int,
             steps: int = 4) -> list[dict[str, Any]]:  # fmt: skip
    """``n`` launches of the hipress-ALGORITHM row (``plan="auto"``); each one's plan digest,
    selection, totals and samples/s."""
    from hipress.bench.e2e import run_config
    from hipress.bench.e2e_configs import E2EOptions, configs_for
    from hipress.bench.netsim import open_network
    from hipress.bench.workloads import WORKLOADS

    opts = E2EOptions(workers=workers, rates_mbit=(rate_mbit,), models=(model,),
                      algorithms=(algorithm,), steps=steps, repeats=1)  # fmt: skip
    cfg = next(c for c in configs_for(opts) if c.name == f"hipress-{algorithm}")
    data = WORKLOADS[model].prepare()
    out: list[dict[str, Any]] = []
    with open_network(workers, rate_mbit) as net:
        for i in range(n):
            res = run_config(net, model, data, cfg, opts)
            if "error" in res:
                raise SystemExit(f"launch {i + 1} failed: {res['error']}")
            plan = res["plan"]
            sel = plan.get("selection") or {}
            out.append({"digest": plan["digest"], "how": sel.get("how"),
                        "threshold": sel.get("threshold"), "totals": plan["totals"],
                        "samples_per_s": res["samples_per_s"], "wall_s": res["wall_s"]})  # fmt: skip
            print(f"{algorithm} launch {i + 1}: plan {plan['digest']} ({sel.get('how')}, "
                  f"threshold {sel.get('threshold')}), {res['samples_per_s']:.1f} samples/s, "
                  f"{res['wall_s']:.0f} s", flush=True)  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    from hipress.cli.args import parse_rate_mbit

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--bandwidth", type=parse_rate_mbit, default=1000.0)
    ap.add_argument("--model", default="lstm-lm")
    ap.add_argument("--algorithms", default="onebit,topk")
    ap.add_argument("--launches", type=int, default=10)
    ap.add_argument("--json", help="write every launch's figures here")
    args = ap.parse_args(argv)
    report: dict[str, Any] = {"workers": args.workers, "rate_mbit": args.bandwidth,
                              "model": args.model, "algorithms": {}}  # fmt: skip
    for alg in args.algorithms.split(","):
        runs = launches(args.workers, args.bandwidth, args.model, alg, args.launches)
        digest, same = collections.Counter(r["digest"] for r in runs).most_common(1)[0]
        report["algorithms"][alg] = {"launches": runs, "same": same, "digest": digest}
        print(f"{alg}: {same} of {len(runs)} launches gave the same plan ({digest})")
    report["loadavg"] = os.getloadavg()
    report["date"] = time.strftime("%Y-%m-%d %H:%M:%S")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
