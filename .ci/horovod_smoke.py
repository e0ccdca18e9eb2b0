"""Smoke test of the Horovod seams hipress builds on: horovod.torch over Gloo, on CPU.

Run it under the launcher (2 processes on this host, no ssh, no MPI)::

    horovodrun -np 2 -H localhost:2 --gloo python .ci/horovod_smoke.py

or run it directly (``python .ci/horovod_smoke.py``): it then re-launches itself that way with the
``horovodrun`` that sits next to the running python. Every rank checks every result against values
computed locally; the process exits 1 on the first wrong result (horovodrun then exits non-zero),
0 when all checks pass.

Checks, each with a distinct per-rank payload so a swapped, dropped or duplicated piece shows up:
allreduce float32 (sum and average, sync and in-place async), allgather uint8 with uneven first
dimensions (sync and async), alltoall uint8 with uneven splits (async via ``synchronize`` and the
sync ``alltoall`` return shapes), and several operations in flight at once, synchronised out of
order.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import torch


class SmokeFailure(Exception):
    """A collective returned a result different from the locally computed expectation."""


def _check(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    """Raise SmokeFailure unless ``got`` has the dtype, shape and values of ``want``."""
    if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
        raise SmokeFailure(
            f"{name}: got dtype={got.dtype} shape={tuple(got.shape)} {got.flatten()[:16].tolist()}, "
            f"want dtype={want.dtype} shape={tuple(want.shape)} {want.flatten()[:16].tolist()}"
        )


def _payload_u8(rank: int, rows: int, cols: int) -> torch.Tensor:
    """The uint8 block rank ``rank`` contributes: ``rows`` x ``cols``, values unique per rank."""
    base = torch.arange(rows * cols, dtype=torch.int64).reshape(rows, cols)
    return ((base * 7 + 31 * rank + 200) % 256).to(torch.uint8)


def run_checks() -> list[str]:
    """Run every check in this (already launched) Horovod process.

    Returns the names of the checks that passed; raises SmokeFailure on the first wrong result.
    """
    import horovod.torch as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if size < 2:
        raise SmokeFailure(f"expected at least 2 processes, got size={size}")
    passed: list[str] = []

    # allreduce float32: sum and average of rank-dependent values (exact in float32).
    x = torch.arange(1000, dtype=torch.float32) * (rank + 1)
    coeff = sum(r + 1 for r in range(size))
    want_sum = torch.arange(1000, dtype=torch.float32) * coeff
    _check("allreduce sum", hvd.allreduce(x, op=hvd.Sum, name="ar.sum"), want_sum)
    _check("allreduce average", hvd.allreduce(x, op=hvd.Average, name="ar.avg"), want_sum / size)
    passed.append("allreduce float32 sum/average")

    y = x.clone()
    out = hvd.synchronize(hvd.allreduce_async_(y, op=hvd.Sum, name="ar.inplace"))
    _check("allreduce_async_ result", out, want_sum)
    _check("allreduce_async_ in place", y, want_sum)
    passed.append("allreduce_async_ float32 in place + synchronize")

    # allgather uint8 with uneven first dimensions: rank r sends r + 1 rows.
    want_gather = torch.cat([_payload_u8(r, r + 1, 5) for r in range(size)])
    mine = _payload_u8(rank, rank + 1, 5)
    _check("allgather uint8", hvd.allgather(mine, name="ag.sync"), want_gather)
    passed.append("allgather uint8 uneven")
    _check(
        "allgather_async uint8",
        hvd.synchronize(hvd.allgather_async(mine, name="ag.async")),
        want_gather,
    )
    passed.append("allgather_async uint8 + synchronize")

    # alltoall uint8, uneven splits: rank s sends (s + d + 1) elements to rank d.
    def block(src: int, dst: int) -> torch.Tensor:
        return _payload_u8(src * size + dst, src + dst + 1, 1).flatten()

    send = torch.cat([block(rank, d) for d in range(size)])
    splits = torch.tensor([rank + d + 1 for d in range(size)], dtype=torch.int32)
    want_recv = torch.cat([block(s, rank) for s in range(size)])
    want_rsplits = torch.tensor([s + rank + 1 for s in range(size)], dtype=torch.int32)
    result = hvd.synchronize(hvd.alltoall_async(send, splits=splits, name="a2a.async"))
    if not (isinstance(result, tuple) and len(result) == 2):
        raise SmokeFailure(f"synchronize(alltoall_async) returned {type(result)}, want a 2-tuple")
    _check("alltoall_async output", result[0], want_recv)
    _check("alltoall_async received splits", result[1], want_rsplits)
    passed.append("alltoall_async uint8 uneven splits + synchronize -> (output, splits)")

    sync_result = hvd.alltoall(send, splits=splits, name="a2a.sync")
    if not isinstance(sync_result, tuple):
        raise SmokeFailure(f"alltoall with splits returned {type(sync_result)}, want a tuple")
    _check("alltoall output", sync_result[0], want_recv)
    _check("alltoall received splits", sync_result[1], want_rsplits)
    even = torch.cat([torch.full((3,), 10 * rank + d, dtype=torch.uint8) for d in range(size)])
    even_out = hvd.alltoall(even, name="a2a.even")
    if not isinstance(even_out, torch.Tensor):
        raise SmokeFailure(f"alltoall without splits returned {type(even_out)}, want a tensor")
    _check(
        "alltoall even",
        even_out,
        torch.cat([torch.full((3,), 10 * s + rank, dtype=torch.uint8) for s in range(size)]),
    )
    passed.append("alltoall returns (tensor, splits) with splits, tensor without")

    # Several operations in flight at once, synchronised in reverse order of submission.
    handles = [
        ("ag", hvd.allgather_async(mine, name="mix.ag")),
        ("a2a", hvd.alltoall_async(send, splits=splits, name="mix.a2a")),
        ("ar", hvd.allreduce_async_(x.clone(), op=hvd.Sum, name="mix.ar")),
    ]
    got = {key: hvd.synchronize(h) for key, h in reversed(handles)}
    _check("mixed allgather", got["ag"], want_gather)
    _check("mixed alltoall", got["a2a"][0], want_recv)
    _check("mixed allreduce", got["ar"], want_sum)
    passed.append("3 async ops in flight, synchronised out of order")

    hvd.shutdown()
    return passed


def launch(np: int = 2) -> int:
    """Re-run this file under ``horovodrun -np <np> --gloo`` on localhost; return its exit code."""
    horovodrun = Path(sys.executable).with_name("horovodrun")
    cmd = [
        str(horovodrun),
        "-np",
        str(np),
        "-H",
        f"localhost:{np}",
        "--gloo",
        sys.executable,
        str(Path(__file__).resolve()),
    ]
    print("+", " ".join(cmd), flush=True)
    start = time.perf_counter()
    code = subprocess.call(cmd)
    print(f"horovodrun exited {code} after {time.perf_counter() - start:.1f} s", flush=True)
    return code


def main() -> int:
    """Entry point: launch if not under horovodrun, else run the checks. Returns the exit code."""
    if "HOROVOD_RANK" not in os.environ:
        return launch()
    rank = os.environ["HOROVOD_RANK"]
    try:
        passed = run_checks()
    except SmokeFailure as exc:
        print(f"[rank {rank}] FAIL {exc}", file=sys.stderr, flush=True)
        return 1
    for name in passed:
        print(f"[rank {rank}] ok   {name}", flush=True)
    print(f"[rank {rank}] horovod smoke OK ({len(passed)} checks)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
