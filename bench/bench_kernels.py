"""Kernel benchmark: encode / decode throughput of the generated kernels against plain
torch-ops implementations of the same algorithms, with the device's copy bandwidth (measured
in the same run) as the roofline. GB/s counts gradient input bytes (4 per element).

``--device``: ``cpu`` (the C kernels), ``cuda`` (the CUDA kernels on CUDA tensors, timed with
CUDA events; the default where a GPU is available), ``emulated`` (the CUDA kernels on the CPU
emulator: a check of this benchmark's CUDA path, its figures say nothing about a GPU).

On a GPU a copy moves 8 bytes per element (no read-for-ownership), so the traffic rate is 2 x
copy GB/s, and a kernel's compulsory traffic counts each write once.

Roofline per algorithm: ``dst.copy_(src)`` moves 12 bytes of memory traffic per element (read,
read-for-ownership of the destination line, write), so the traffic rate is 3 x copy GB/s. An
encode must at least read the gradient (4 B), read and write its per-element state (2 x state
bytes) and write the payload (2 x payload bytes, read-for-ownership included); a decode reads
the payload and writes 4 B (+4 B read-for-ownership). The roofline is the rate at which that
compulsory traffic moves, capped by the rate at which its reads alone move at the read-only
bandwidth (``x.sum()``, measured in the same run: on an AVX2 machine of 2026-11-23 it was 13
GB/s against a copy of 11, not the 3 x 11 the traffic model alone would allow a read-mostly
kernel); "% roof" is how close a kernel gets (passes beyond the first, e.g. a reduction before
its map, are what keeps multi-pass algorithms below it).

OpenMP threads: the run re-executes itself with ``OMP_WAIT_POLICY=PASSIVE`` unless that variable
is set. With libgomp's default (spin before sleeping), every parallel region on a 2-core machine
shared with other processes waits for a spinning or descheduled thread: measured here under a
load average of 3, a 4 MB ``copy_`` ran at 0.95 GB/s with the default policy and 54 GB/s with
PASSIVE (the same held for the kernels: 0.17 vs 11.8 GB/s, onebit encode of 1M floats). The policy
in force and the load average are recorded in the JSON.

    hipress bench kernels [--sizes 1K,1M,64M] [--algorithms onebit,topk] [--reps 5]
    python bench/bench_kernels.py ...          (same options)

The torch-ops versions do each algorithm's work with its default parameters, without the C
kernels' NaN/Inf handling: the sparsifiers send the same fraction (dgc 0.1%, the others 1%), and
dgc's includes its momentum correction and masking (until 2026-11-25 it ran graddrop's work
with dgc's sample size, 1% sent and no momentum).

``sum4``: CaSync's averaging of 4 payloads (``decode_sum``, GB/s of decoded float32, 4 x 4 bytes
per element), and ``sum4 x`` its speed-up over one decode pass per payload
(``decode_sum_by_parts``), measured side by side.

Prints a table and writes bench/results/kernels.json. Outputs are preallocated; every timed
call is a steady-state call (workspaces exist, pages are touched).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hipress.compll import Algorithm, algorithms, load
from hipress.compll.algorithm import decode_sum_by_parts
from hipress.timing import best_of

Fn = Callable[[], object]


def _size(s: str) -> int:
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(s[:-1] if s[-1:] in "KMG" else s) * mult


def best(fn: Fn, reps: int, cuda: bool = False) -> float:
    """Best time of ``reps`` calls after one warm-up call (seconds): wall time, or on a GPU
    (``cuda``) the time between CUDA events around each call."""
    return best_of(fn, reps, cuda)


# ---------------------------------------------------------------- plain torch-ops versions


def _pack(v: torch.Tensor, bits: int) -> torch.Tensor:
    per = 8 // bits
    sh = torch.arange(per, dtype=torch.int32) * bits
    return (v.view(-1, per).to(torch.int32) << sh).sum(1).to(torch.uint8)


def _unpack(b: torch.Tensor, bits: int) -> torch.Tensor:
    per = 8 // bits
    sh = torch.arange(per, dtype=torch.int32) * bits
    return ((b.to(torch.int32).view(-1, 1) >> sh) & ((1 << bits) - 1)).view(-1)


def torch_versions(name: str, g: torch.Tensor) -> tuple[Fn, Fn]:
    """(encode, decode) closures doing the algorithm's work with torch ops (n % 512 == 0), on
    ``g``'s device."""
    with torch.device(g.device):
        enc, dec = _torch_versions(name, g)

    def on_device(fn: Fn) -> Fn:
        def call() -> object:
            with torch.device(g.device):
                return fn()

        return call

    return on_device(enc), on_device(dec)


def _torch_versions(name: str, g: torch.Tensor) -> tuple[Fn, Fn]:
    n = g.numel()
    r = torch.zeros(n)
    out = torch.empty(n)
    if name in ("onebit", "efsignsgd", "signsgd"):
        st: dict[str, Any] = {}

        def enc() -> None:
            c = g + r if name != "signsgd" else g
            neg = c < 0
            if name == "onebit":
                pos = torch.where(neg, 0.0, c).double().sum() / max(1, int((~neg).sum()))
                ng = torch.where(neg, c, 0.0).double().sum() / max(1, int(neg.sum()))
                st["s"], st["p"], st["q"] = _pack(neg, 1), float(pos), float(ng)
                r.copy_(c - torch.where(neg, ng, pos).float())
            else:
                sc = float(c.abs().double().sum() / n)
                st["s"], st["p"], st["q"] = _pack(neg, 1), sc, -sc
                if name == "efsignsgd":
                    r.copy_(c - torch.where(neg, -sc, sc))

        def dec() -> None:
            torch.where(_unpack(st["s"], 1).bool(), torch.tensor(st["q"], dtype=torch.float32),
                        torch.tensor(st["p"], dtype=torch.float32), out=out)  # fmt: skip

        return enc, dec
    if name in ("fp16", "bf16"):
        h = torch.empty(n, dtype=torch.float16 if name == "fp16" else torch.bfloat16)
        return (lambda: h.copy_(g)), (lambda: out.copy_(h))
    if name == "int8":
        q = torch.empty(n, dtype=torch.int8)
        sc: dict[str, torch.Tensor] = {}

        def enc() -> None:
            s = g.view(-1, 256).abs().amax(1, keepdim=True) / 127
            sc["s"] = s
            q.copy_(torch.round(g.view(-1, 256) / s).clamp(-127, 127).view(-1))

        return enc, lambda: torch.mul(q.view(-1, 256), sc["s"], out=out.view(-1, 256))
    if name in ("terngrad", "qsgd", "tbq"):
        st = {}

        def enc() -> None:
            if name == "terngrad":
                lo, hi = torch.aminmax(g)
                gap = (hi - lo) / 3
                qv = torch.floor((g - lo) / gap + torch.rand(n)).clamp(0, 3)
                st["q"], st["lo"], st["gap"] = _pack(qv.to(torch.uint8), 2), lo, gap
            elif name == "qsgd":
                nm = g.view(-1, 512).norm(dim=1, keepdim=True)
                lv = torch.floor(g.view(-1, 512).abs() / nm * 7 + torch.rand(n // 512, 512)).clamp(
                    0, 7
                )
                qv = lv.to(torch.uint8) | ((g.view(-1, 512) < 0).to(torch.uint8) << 3)
                st["q"], st["nm"] = _pack(qv.view(-1), 4), nm
            else:
                c = g + r
                qv = torch.where(c >= 0.01, 1, torch.where(c <= -0.01, 2, 0)).to(torch.uint8)
                st["q"] = _pack(qv, 2)
                r.copy_(c - torch.where(qv == 1, 0.01, torch.where(qv == 2, -0.01, 0.0)))

        def dec() -> None:
            if name == "terngrad":
                torch.add(st["lo"], _unpack(st["q"], 2).float() * st["gap"], out=out)
            elif name == "qsgd":
                u = _unpack(st["q"], 4).view(-1, 512)
                v = st["nm"] * ((u & 7).float() / 7)
                out.view(-1, 512).copy_(torch.where(u >> 3 == 1, -v, v))
            else:
                u = _unpack(st["q"], 2)
                out.copy_(torch.where(u == 1, 0.01, torch.where(u == 2, -0.01, 0.0)))

        return enc, dec
    # sparsifiers: indices + values, decode = scatter
    st = {}
    u = torch.zeros(n) if name == "dgc" else r
    frac = 0.001 if name == "dgc" else 0.01  # dgc's s_percent; the others send 1%

    def enc_sparse() -> None:
        if name == "dgc":  # momentum correction: u = m u + g, v = v + u (in place)
            u.mul_(0.9).add_(g)
            c = r.add_(u)
        else:
            c = g + r if name != "randomk" else g
        kk = max(1, math.ceil(n * frac))
        if name == "topk":
            idx = torch.topk(c.abs(), kk, sorted=False).indices.sort().values
        elif name == "randomk":
            idx = torch.randperm(n)[:kk].sort().values
        else:  # dgc / graddrop: sampled threshold + compaction
            ns = max(math.ceil(n * 0.001), 16000 if name == "dgc" else 1600)
            sample = c[torch.randint(0, n, (min(n, ns),))].abs()
            thr = torch.kthvalue(
                sample, max(1, sample.numel() - math.ceil(sample.numel() * frac))
            ).values
            idx = torch.nonzero(c.abs() >= thr).view(-1)[: 2 * kk]
        st["i"], st["v"] = idx, c[idx]
        if name == "dgc":  # momentum factor masking
            u[idx] = 0
            r[idx] = 0
        elif name != "randomk":
            r.copy_(c)
            r[idx] = 0

    def dec_sparse() -> None:
        out.zero_()
        out.index_put_((st["i"],), st["v"], accumulate=True)

    return enc_sparse, dec_sparse


# ---------------------------------------------------------------- the benchmark


def roofline(copy: float, read: float, traffic: float, reads: float, gpu: bool = False) -> float:
    """GB/s of gradient input at which a kernel's compulsory memory traffic moves: ``traffic``
    bytes per element (reads, writes twice: read-for-ownership; on a GPU once) at the copy's
    traffic rate (12 bytes per element at ``copy`` GB/s of input; on a GPU 8), and never faster
    than its ``reads`` bytes per element at the read-only rate (``read``: a ``sum``, 4 bytes per
    element), which on some machines is far below 3x the copy rate."""
    by_traffic = (8 if gpu else 12) * copy / traffic
    return min(by_traffic, 4 * read / reads) if reads > 0 else by_traffic


def _setup(kind: str) -> tuple[str, torch.device, Callable[[str], Algorithm]]:
    """The device kind to measure, its torch device, and how to load an algorithm there."""
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("bench kernels --device cuda: torch sees no CUDA GPU")
        return kind, torch.device("cuda"), lambda name: load(name, backend="cuda")
    if kind == "emulated":
        from hipress.compll.cuda_emu import emulated_backend

        def make(name: str) -> Algorithm:
            prog = load(name, backend="reference").program
            return Algorithm(prog, emulated_backend(prog, blocks=None))

        return kind, torch.device("cpu"), make
    return "cpu", torch.device("cpu"), lambda name: load(name, backend="cpu")


def run(args: argparse.Namespace) -> int:
    kind, device, make = _setup(getattr(args, "device", "auto"))
    gpu = kind == "cuda"
    if kind == "cpu" and "OMP_WAIT_POLICY" not in os.environ:
        # libgomp reads it once, when torch loads it: set it and run this command again
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        print("[bench kernels] re-running with OMP_WAIT_POLICY=PASSIVE", flush=True)
        os.execv(sys.executable, [sys.executable, *sys.argv])
    sizes = [_size(s) for s in args.sizes.split(",") if s.strip()]
    names = [a for a in args.algorithms.split(",") if a] or algorithms()
    results: dict[str, Any] = {
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "load_average_start": os.getloadavg()[0],
            "device": kind,
            "gpu": torch.cuda.get_device_name() if gpu else None,
        },
        "units": "GB/s of float32 gradient input (4 bytes per element); copy = dst.copy_(src), "
        "read = src.sum()",
        "copy": {},
        "kernels": {},
    }
    gen = torch.Generator(device=device).manual_seed(0)

    def timed(fn: Fn, reps: int) -> float:
        return best(fn, reps, cuda=gpu)

    print(f"{'algorithm':10s} {'n':>9s} {'enc':>8s} {'roof':>6s} {'%':>4s} {'dec':>8s} "
          f"{'roof':>6s} {'%':>4s} {'torch enc':>10s} {'torch dec':>10s} {'enc x':>6s} "
          f"{'copy':>7s} {'sum4':>7s} {'sum4 x':>6s}")  # fmt: skip
    for n in sizes:
        x = torch.randn(n, generator=gen, device=device)
        y = torch.empty(n, device=device)
        copy = 4 * n / timed(lambda: y.copy_(x), args.reps) / 1e9  # noqa: B023
        read = 4 * n / timed(lambda: x.sum(), args.reps) / 1e9  # noqa: B023
        results["copy"][str(n)] = copy
        results.setdefault("read", {})[str(n)] = read
        for name in names:
            alg = make(name)
            st = alg.init_state(n, seed=1, device=device)
            pay = torch.empty(alg.payload_nbytes(n), dtype=torch.uint8, device=device)
            te = timed(lambda: alg.encode(x, st, pay), args.reps)  # noqa: B023
            td = timed(lambda: alg.decode(pay, n, y), args.reps)  # noqa: B023
            # CaSync's averaging of 4 workers' payloads: the kernel, and one pass per payload
            four = [pay] * 4
            ts4 = timed(lambda: alg.decode_sum(four, n, out=y, divide_by=4), args.reps)  # noqa: B023
            tp4 = timed(lambda: decode_sum_by_parts(alg.backend, four, n, y, 4), args.reps)  # noqa: B023
            state_b = sum(t.numel() * t.element_size() for t in st.tensors.values()
                          if t.numel() >= n)  # fmt: skip
            w = 1 if gpu else 2  # a write's traffic: read-for-ownership on a CPU
            enc_b = (4 * n + 2 * state_b + w * pay.numel()) / n
            dec_b = (pay.numel() + 4 * w * n) / n
            enc_r, dec_r = (4 * n + state_b) / n, pay.numel() / n  # bytes read
            row: dict[str, Any] = {"encode": 4 * n / te / 1e9, "decode": 4 * n / td / 1e9,
                                   "encode_s": te, "decode_s": td, "copy": copy, "read": read,
                                   "decode_sum4": 16 * n / ts4 / 1e9,
                                   "decode_sum4_by_parts": 16 * n / tp4 / 1e9,
                                   "encode_bytes_per_elem": enc_b,
                                   "decode_bytes_per_elem": dec_b,
                                   "encode_roofline": roofline(copy, read, enc_b, enc_r, gpu),
                                   "decode_roofline": roofline(copy, read, dec_b, dec_r, gpu)}  # fmt: skip
            if not args.no_torch and n % 512 == 0:
                enc, dec = torch_versions(name, x)
                row["torch_encode"] = 4 * n / timed(enc, max(1, args.reps // 2)) / 1e9
                row["torch_decode"] = 4 * n / timed(dec, max(1, args.reps // 2)) / 1e9
            results["kernels"].setdefault(name, {})[str(n)] = row
            te_t, td_t = row.get("torch_encode"), row.get("torch_decode")
            ratio = f"{row['encode'] / te_t:6.1f}" if te_t else "     -"
            er, dr = row["encode_roofline"], row["decode_roofline"]
            print(f"{name:10s} {n:>9d} {row['encode']:8.2f} {er:6.1f} "
                  f"{100 * row['encode'] / er:4.0f} {row['decode']:8.2f} {dr:6.1f} "
                  f"{100 * row['decode'] / dr:4.0f} "
                  f"{te_t if te_t else float('nan'):10.2f} {td_t if td_t else float('nan'):10.2f} "
                  f"{ratio} {copy:7.2f} {row['decode_sum4']:7.2f} "
                  f"{row['decode_sum4'] / row['decode_sum4_by_parts']:6.1f}", flush=True)  # fmt: skip
    results["machine"]["load_average_end"] = os.getloadavg()[0]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    from hipress.compll.cli_codegen import add_bench_kernels_parser

    parser = argparse.ArgumentParser(prog="bench_kernels.py")
    sub = parser.add_subparsers(dest="bench", required=True)
    add_bench_kernels_parser(sub)
    raise SystemExit(run(parser.parse_args(["kernels", *__import__("sys").argv[1:]])))
