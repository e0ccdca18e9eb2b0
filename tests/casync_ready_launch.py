"""Launches of CaSync's ``plan="auto"`` with ready times, for the tests and the stability count.

:func:`auto_worker` trains a small model (an embedding, then four linear layers) for a few
steps on 2 gloo ranks with ``plan="auto", ready_steps=3`` and returns what each rank planned.
Run as a script, it launches that ``--launches`` times and reports how many launches gave the
same plan (:meth:`Plan.digest`) as the most common one:

    python tests/casync_ready_launch.py --launches 10 [--json FILE]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from typing import Any

VOCAB, DIM, BATCH, SEQ, WIDTH = 131072, 32, 256, 2, 512
USED = 64  # the tokens drawn: at most 64 of the embedding's rows touched in a step
STEPS = 5  # 3 measured, the plan at step 3 (its rows counted), the row decision at step 4


def auto_worker(rank: int, world_size: int, steps: int = STEPS) -> dict[str, Any]:
    """One rank's run: the plan after ``steps`` steps, its ready times and what it logged."""
    import logging

    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from hipress.casync import register

    lines: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda r: lines.append(r.getMessage())  # type: ignore[method-assign]
    for name in ("hipress.casync.ready", "hipress.secopa.model.rowexposure"):
        logging.getLogger(name).addHandler(handler)
        logging.getLogger(name).setLevel(logging.INFO)
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Embedding(VOCAB, DIM), nn.Flatten(), nn.Linear(SEQ * DIM, WIDTH),
        nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, 4),
    )  # fmt: skip
    ddp = DistributedDataParallel(model)
    state = register(ddp, "onebit", plan="auto", ready_steps=3)
    gen = torch.Generator().manual_seed(100 + rank)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        tokens = torch.randint(0, USED, (BATCH, SEQ), generator=gen)
        ddp(tokens).square().mean().backward()
        opt.step()
        opt.zero_grad()
    plan = state.plan
    return {
        "digest": plan.digest(),
        "readiness": dict(plan.meta.get("readiness") or {}),
        "row_prices": dict(plan.meta.get("row_prices") or {}),
        "bucket_cap": dict(plan.meta.get("bucket_cap") or {}),
        "rows": {e.name: e.row_bound for e in plan.entries if e.row_bound},
        "names": [e.name for e in plan.entries],
        "choices": [(e.name, e.compress, e.strategy.value, e.partitions, e.row_bound)
                    for e in plan.entries],
        "totals": dict(plan.totals),
        "selection": dict(plan.meta.get("selection") or {}),
        "log": lines,
    }


def launch() -> list[dict[str, Any]]:
    """One 2-rank launch of :func:`auto_worker`; the ranks' results."""
    from dist_utils import run_workers

    return run_workers(auto_worker, 2, timeout=180)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--launches", type=int, default=10)
    p.add_argument("--json", default=None, help="write the digests and the count here")
    args = p.parse_args(argv)
    digests, walls, choices = [], [], []
    for i in range(args.launches):
        t0 = time.perf_counter()
        ranks = launch()
        walls.append(time.perf_counter() - t0)
        assert len({r["digest"] for r in ranks}) == 1, "ranks disagree on the plan"
        digests.append(ranks[0]["digest"])
        choices.append({k: ranks[0][k] for k in ("choices", "selection", "totals")})
        print(f"launch {i + 1}: plan {digests[-1]}, rows {sorted(ranks[0]['rows'])}, "
              f"{walls[-1]:.1f} s", flush=True)  # fmt: skip
    (top, same), = collections.Counter(digests).most_common(1)
    load = os.getloadavg()
    print(f"{same} of {args.launches} launches gave the same plan ({top}); load average "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"launches": args.launches, "same": same, "digests": digests,
                       "choices": choices, "wall_s": walls, "loadavg": load}, f,
                      indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main())
