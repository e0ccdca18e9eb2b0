"""The scan for the rows of a gradient that hold a non-zero (what row-sparse synchronisation does
first, every step: :func:`hipress.codec.rowsparse.nonzero_rows`) against the read roofline.

For each ``rows x width`` float32 matrix with ``--touched`` random rows non-zero, the best of
``--reps`` calls of:

- ``torch``: the torch path (the rows read as 64-bit words, ``view(int64).any(1).nonzero()``);
- ``scan``: :func:`~hipress.codec.rowsparse.nonzero_rows` (the CompLL kernel ``rowscan.cll``,
  then the indices);
- ``kernel``: the kernel's pass alone (one flag per block of the row);
- ``read``: ``x.sum()`` over the same bytes, the read-only bandwidth the kernels benchmark also
  takes as its read roofline.

GB/s counts the matrix's bytes (4 per element) read once. Run on ``--threads`` torch threads
(default 1, as each training worker runs). Prints a table and writes ``rowscan.json`` under
``--out`` with the load average.

    python -m hipress.bench.rowscan [--shapes 32768x512,50257x768] [--threads 1] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hipress.codec.rowsparse import nonzero_rows, scan_block, scan_kernel

DEFAULT_SHAPES = "32768x512,50257x768,4096x1000,100000x9"


def best(fn: Callable[[], object], reps: int) -> float:
    """The shortest of ``reps`` timed calls of ``fn`` after one untimed call, in seconds."""
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def torch_rows(g: torch.Tensor) -> torch.Tensor:
    """The torch path: the rows read as 64-bit words where the layout allows."""
    return g.view(torch.int64).any(1).nonzero().flatten() if g.shape[1] % 2 == 0 else (
        g.view(torch.int32).ne(0).any(1).nonzero().flatten())  # fmt: skip


def measure(rows: int, width: int, touched: int, reps: int) -> dict[str, Any]:
    """One shape's figures (ms and GB/s of each way, % of the read rate)."""
    gen = torch.Generator().manual_seed(rows * 31 + width)
    g = torch.zeros(rows, width)
    idx = torch.randperm(rows, generator=gen)[: min(touched, rows)]
    g[idx] = torch.randn(idx.numel(), width, generator=gen)
    want = torch.sort(idx).values
    if not (torch.equal(nonzero_rows(g), want) and torch.equal(torch_rows(g), want)):
        raise RuntimeError(f"the row scans of a {rows}x{width} matrix miss its touched rows")
    seg = scan_block(width)
    alg = scan_kernel(seg)
    gb = g.numel() * 4 / 1e9
    out: dict[str, Any] = {"shape": [rows, width], "touched": idx.numel(), "seg": seg}
    ways: dict[str, Callable[[], object]] = {
        "torch": lambda: torch_rows(g),
        "scan": lambda: nonzero_rows(g),
        "read": lambda: g.sum(),
    }
    if alg is not None:
        st = alg.init_state(g.numel())
        pay = torch.empty(alg.payload_nbytes(g.numel()), dtype=torch.uint8)
        ways["kernel"] = lambda: alg.encode(g, st, pay)
    for name, fn in ways.items():
        t = best(fn, reps)
        out[f"{name}_ms"], out[f"{name}_gbs"] = 1e3 * t, gb / t
    for name in ("torch", "scan", "kernel"):
        if f"{name}_gbs" in out:
            out[f"{name}_roof"] = out[f"{name}_gbs"] / out["read_gbs"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hipress.bench.rowscan", description=__doc__)
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="ROWSxWIDTH,... (float32)")
    ap.add_argument("--touched", type=int, default=200, help="non-zero rows per matrix")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (workers run 1)")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", type=Path, default=Path("hipress-results"))
    args = ap.parse_args(argv)
    try:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
        if any(len(s) != 2 or min(s) < 1 for s in shapes):
            raise ValueError
    except ValueError:
        ap.error(f"--shapes takes ROWSxWIDTH,... with positive sizes, got {args.shapes!r}")
    torch.set_num_threads(args.threads)
    cases = [measure(r, w, args.touched, args.reps) for r, w in shapes]
    print(f"{'shape':>12} {'torch GB/s':>10} {'scan GB/s':>9} {'kernel GB/s':>11} "
          f"{'read GB/s':>9} {'scan % read':>11} {'scan x torch':>12}")  # fmt: skip
    for c in cases:
        print(f"{c['shape'][0]:>6}x{c['shape'][1]:<5} {c['torch_gbs']:>10.1f} {c['scan_gbs']:>9.1f} "
              f"{c.get('kernel_gbs', float('nan')):>11.1f} {c['read_gbs']:>9.1f} "
              f"{100 * c['scan_roof']:>10.0f}% {c['torch_ms'] / c['scan_ms']:>11.2f}x")  # fmt: skip
    load = os.getloadavg()
    print(f"threads {args.threads}, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "rowscan.json"
    path.write_text(json.dumps({"threads": args.threads, "load_average": load, "cases": cases},
                               indent=2) + "\n")  # fmt: skip
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
