"""``hipress bench kernels``: encode / decode throughput of the generated kernels against plain
torch-ops implementations of the same algorithms (:mod:`hipress.bench.torch_ops`), with the
device's copy bandwidth (measured in the same run) as the roofline. GB/s counts gradient input
bytes (4 per element).

``--device``: ``cpu`` (the C kernels), ``cuda`` (the CUDA kernels on CUDA tensors, timed with
CUDA events; the default where a GPU is available), ``emulated`` (the CUDA kernels on the CPU
emulator: a check of this benchmark's CUDA path, its figures say nothing about a GPU).

The references are three probe kernels, generated, compiled and run exactly as the algorithms
are (same compiler, thread pool and tensors), each timed just before and just after every
algorithm's row (the better of the two is the row's reference, the best of the run goes to the
JSON's ``copy``, ``read`` and ``write``): ``copy`` reads a float32 per element and writes one,
``read`` reads the gradient once (its maximum), ``write`` writes the output once. torch's
``dst.copy_(src)``, ``src.sum()`` and ``dst.fill_(1.0)``, timed once per size, are kept as
``copy_torch``, ``read_torch`` and ``write_torch``: on a shared machine they have swung 2x
between runs while the kernels did not.

On a GPU a copy moves 8 bytes per element (no read-for-ownership), so the traffic rate is 2 x
copy GB/s, and a kernel's compulsory traffic counts each write once.

Roofline per algorithm: a copy moves 12 bytes of memory traffic per element (read,
read-for-ownership of the destination line, write), so the traffic rate is 3 x copy GB/s. An
encode must at least read the gradient (4 B; 8 B where each element needs a reduction over all
of it first, e.g. TernGrad's min and max: :mod:`hipress.bench.traffic`), read and write its
per-element state (2 x state bytes) and write the payload (2 x payload bytes, read-for-ownership
included); a decode reads the payload and writes 4 B (+4 B read-for-ownership). The roofline is
the rate at which that compulsory traffic moves, capped by the rate at which its reads alone
move at the read-only bandwidth (the ``read`` probe; on some machines it is far below what the
traffic model alone would allow a read-mostly kernel); "% roof" is how close a kernel gets
(passes a kernel makes beyond those counted, e.g. a selection's second look at its keys, and
work that is not memory traffic, e.g. random numbers, are what keeps it below).

OpenMP threads: run as ``hipress`` (or ``python -m hipress``), the command re-executes itself
with ``OMP_WAIT_POLICY=PASSIVE`` unless that variable is set; called in-process
(``hipress.cli.main([...])``) it warns instead (:mod:`hipress.cli.waitpolicy`). With libgomp's default (spin before sleeping), every parallel region on a small machine
shared with other processes waits for a spinning or descheduled thread, which can slow a copy
or a kernel by an order of magnitude. The policy in force and the load average are recorded in
the JSON.

``philox``: the generated kernel of a probe that only draws one Philox word per element (GB/s
of float32 input, nothing read): the ceiling of an algorithm bound by its random numbers (randomk
draws two words per element, qsgd and terngrad one).

Write-once roofline of the decodes: ``write`` (the probe), the least any decode into ``y`` can
take. ``dec/w``, ``sum2/w`` and ``sum4/w`` are how many times that time a decode, and the
averaging of 2 and 4 distinct payloads (``decode_sum``, divided by 2 or 4), take at the same
size (1.0 = as fast as writing the output once; the JSON has each one's GB/s of output,
``decode_out``, ``decode_sum2_out`` and ``decode_sum4_out``). Reading the payloads is traffic a
write-once time does not include: each ``bound`` column is the least a decode of 1, 2 and 4
payloads can take in write-once times, the output written and the payloads read at the rate
the ``copy`` probe reads its input; a sum of payloads as large as its output (fp16's two)
cannot come close to 1.0.

``sum4``: CaSync's averaging of 4 payloads (``decode_sum``, GB/s of decoded float32, 4 x 4 bytes
per element), and ``sum4 x`` its speed-up over one decode pass per payload
(``decode_sum_by_parts``), measured side by side.

Prints a table and writes ``hipress-results/kernels.json`` (``--out``). Outputs are preallocated;
every timed call is a steady-state call (workspaces exist, pages are touched).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hipress.bench.provenance import cpu_name, stamp
from hipress.bench.torch_ops import Fn, torch_versions
from hipress.bench.traffic import grad_reads
from hipress.cli.waitpolicy import before_timing
from hipress.compll import Algorithm, algorithms, load, load_file, load_source
from hipress.compll.backends.base import decode_sum_by_parts
from hipress.compll.ir.source import SourceFile
from hipress.timing import best_of


def _size(s: str) -> int:
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(s[:-1] if s[-1:] in "KMG" else s) * mult


def best(fn: Fn, reps: int, cuda: bool = False) -> float:
    """Best time of ``reps`` calls after one warm-up call (seconds): wall time, or on a GPU
    (``cuda``) the time between CUDA events around each call."""
    return best_of(fn, reps, cuda)


def roofline(copy: float, read: float, traffic: float, reads: float, gpu: bool = False) -> float:
    """GB/s of gradient input at which a kernel's compulsory memory traffic moves: ``traffic``
    bytes per element (reads, writes twice: read-for-ownership; on a GPU once) at the copy's
    traffic rate (12 bytes per element at ``copy`` GB/s of input; on a GPU 8), and never faster
    than its ``reads`` bytes per element at the read-only rate (``read``: a ``sum``, 4 bytes per
    element), which on some machines is far below 3x the copy rate."""
    by_traffic = (8 if gpu else 12) * copy / traffic
    return min(by_traffic, 4 * read / reads) if reads > 0 else by_traffic


def _load(name: str, backend: str) -> Algorithm:
    """A shipped algorithm by name, or a ``.cll`` file by its path."""
    return load_file(name, backend=backend) if name.endswith(".cll") else load(name, backend=backend)


def _emulated(ref: Algorithm) -> Algorithm:
    """``ref``'s program on the CUDA emulator (its CUDA kernels run on the CPU)."""
    from hipress.compll.backends.cuda.emu import emulated_backend

    return Algorithm(ref.program, emulated_backend(ref.program, blocks=None))


def _setup(kind: str) -> tuple[str, torch.device, Callable[[str], Algorithm]]:
    """The device kind to measure, its torch device, and how to load an algorithm there."""
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("bench kernels --device cuda: torch sees no CUDA GPU")
        return kind, torch.device("cuda"), lambda name: _load(name, "cuda")
    if kind == "emulated":
        return kind, torch.device("cpu"), lambda name: _emulated(_load(name, "reference"))
    return "cpu", torch.device("cpu"), lambda name: _load(name, "cpu")


# Philox words alone, as the kernels draw them (a word per element, nothing read, 1/8 byte
# written): the ceiling of an algorithm that draws one word per element (two: half of it)
PHILOX_PROBE = """algorithm philox "one Philox word per element, nothing read";
payload { q: uint<1>[n]; }
encode(g) { let q: uint<1>[n] = map(n, i => urand(i) >> 31); return concat(q); }
decode(p) { return map(n, i => f32(p.q[i])); }
"""

# the write-once probe: a decode that reads one payload scalar and stores it at every element;
# the copy probe: a decode that reads a float32 per element and stores it
WRITE_PROBE = """algorithm write1 "the output written once, nothing read per element";
payload { v: f32; }
encode(g) { return concat(1.0); }
decode(p) { return map(n, i => p.v); }
"""
COPY_PROBE = """algorithm copy1 "the output written once, 4 bytes read per element";
payload { v: f32[n]; }
encode(g) { let v: f32[n] = map(n, i => g[i]); return concat(v); }
decode(p) { return map(n, i => p.v[i]); }
"""
# the read probe: an encode that reads the gradient once and sends its maximum
READ_PROBE = """algorithm read1 "the gradient read once, nothing written per element";
payload { m: f32; }
encode(g) { let m = reduce(max, n, i => g[i]); return concat(m); }
decode(p) { return map(n, i => p.m); }
"""

# every figure's unit in its header: GB/s of float32 gradient input, % of the roofline, x ratios
HEADER = (f"{'algorithm':10s} {'elements':>9s} {'enc GB/s':>8s} {'roof GB/s':>9s} {'% roof':>6s} "
          f"{'dec GB/s':>8s} {'roof GB/s':>9s} {'% roof':>6s} {'torch enc GB/s':>14s} "
          f"{'torch dec GB/s':>14s} {'enc x':>6s} {'copy GB/s':>9s} {'sum4 GB/s':>9s} "
          f"{'sum4 x':>6s} {'write GB/s':>10s} {'dec/w x':>7s} {'bound':>5s} {'sum2/w x':>8s} "
          f"{'bound':>5s} {'sum4/w x':>8s} {'bound':>5s}")  # fmt: skip


def _measure(alg: Algorithm, x: torch.Tensor, y: torch.Tensor, timed: Callable[[Fn, int], float],
             reps: int, gpu: bool) -> dict[str, Any]:  # fmt: skip
    """One algorithm at ``x.numel()`` elements: GB/s of encode, decode and the 4-payload
    average, the bytes each must move and its rooflines (``copy``/``read`` not yet set)."""
    n = x.numel()
    st = alg.init_state(n, seed=1, device=x.device)
    pay = torch.empty(alg.payload_nbytes(n), dtype=torch.uint8, device=x.device)
    te = timed(lambda: alg.encode(x, st, pay), reps)
    td = timed(lambda: alg.decode(pay, n, y), reps)
    # CaSync's averaging of 4 workers' payloads (4 distinct ones, each read from memory): the
    # kernel, and one pass per payload
    four = [pay] + [alg.encode(torch.roll(x, 977 * r), st) for r in (1, 2, 3)]
    ts4 = timed(lambda: alg.decode_sum(four, n, out=y, divide_by=4), reps)
    ts2 = timed(lambda: alg.decode_sum(four[:2], n, out=y, divide_by=2), reps)
    tp4 = timed(lambda: decode_sum_by_parts(alg.backend, four, n, y, 4), reps)
    state_b = sum(t.numel() * t.element_size() for t in st.tensors.values() if t.numel() >= n)
    w = 1 if gpu else 2  # a write's traffic: read-for-ownership on a CPU
    passes = grad_reads(alg.program)  # reads of the gradient no kernel can avoid
    return {"encode": 4 * n / te / 1e9, "decode": 4 * n / td / 1e9,
            "encode_s": te, "decode_s": td,
            "decode_sum4": 16 * n / ts4 / 1e9, "decode_sum4_by_parts": 16 * n / tp4 / 1e9,
            "decode_out": 4 * n / td / 1e9, "decode_sum2_out": 4 * n / ts2 / 1e9,
            "decode_sum4_out": 4 * n / ts4 / 1e9, "decode_sum2_s": ts2, "decode_sum4_s": ts4,
            "encode_grad_reads": passes,
            "encode_bytes_per_elem": (4 * passes * n + 2 * state_b + w * pay.numel()) / n,
            "decode_bytes_per_elem": (pay.numel() + 4 * w * n) / n,
            "encode_reads": (4 * passes * n + state_b) / n,
            "decode_reads": pay.numel() / n}  # fmt: skip


def _line(name: str, n: int, row: dict[str, Any]) -> str:
    te_t, td_t = row.get("torch_encode"), row.get("torch_decode")
    ratio = f"{row['encode'] / te_t:6.1f}" if te_t else "     -"
    er, dr = row["encode_roofline"], row["decode_roofline"]
    return (f"{name:10s} {n:>9d} {row['encode']:8.2f} {er:9.1f} "
            f"{100 * row['encode'] / er:6.0f} {row['decode']:8.2f} {dr:9.1f} "
            f"{100 * row['decode'] / dr:6.0f} "
            f"{te_t if te_t else float('nan'):14.2f} {td_t if td_t else float('nan'):14.2f} "
            f"{ratio} {row['copy']:9.2f} {row['decode_sum4']:9.2f} "
            f"{row['decode_sum4'] / row['decode_sum4_by_parts']:6.1f} {row['write']:10.2f} "
            f"{row['decode_vs_write']:7.2f} {row['sum1_bound']:5.2f} "
            f"{row['decode_sum2_vs_write']:8.2f} {row['sum2_bound']:5.2f} "
            f"{row['decode_sum4_vs_write']:8.2f} {row['sum4_bound']:5.2f}")  # fmt: skip


def _probes(kind: str, x: torch.Tensor, y: torch.Tensor) -> dict[str, Fn]:
    """The reference kernels, generated and run as the algorithms are: ``write`` (``y``
    written once), ``copy`` (``n`` floats read, ``y`` written) and ``read`` (``x`` read once)."""
    n = x.numel()
    w, c, r = (_probe(kind, text) for text in (WRITE_PROBE, COPY_PROBE, READ_PROBE))
    wp, cp = (a.encode(x, a.init_state(n, device=x.device)) for a in (w, c))
    rs = r.init_state(n, device=x.device)
    rp = torch.empty(r.payload_nbytes(n), dtype=torch.uint8, device=x.device)
    return {"write": lambda: w.decode(wp, n, y), "copy": lambda: c.decode(cp, n, y),
            "read": lambda: r.encode(x, rs, rp)}  # fmt: skip


def _rates(probes: dict[str, Fn], n: int, timed: Callable[[Fn, int], float],
           reps: int) -> dict[str, float]:  # fmt: skip
    """GB/s of float32 (``n`` elements) each probe moves."""
    return {k: 4 * n / timed(fn, reps) / 1e9 for k, fn in probes.items()}


def _probe(kind: str, text: str) -> Algorithm:
    """A probe program (``text``) on the device kind being measured."""
    src = SourceFile("probe.cll", text)
    if kind != "emulated":
        return load_source(src, backend=kind)
    return _emulated(load_source(src, backend="reference"))


def run(args: argparse.Namespace) -> int:
    """Handler of ``hipress bench kernels``: prints the table, writes the JSON, returns 0."""
    kind, device, make = _setup(getattr(args, "device", "auto"))
    gpu = kind == "cuda"
    if kind == "cpu":  # re-executed with the passive wait only when run as `hipress`
        before_timing("hipress bench kernels", may_reexec=getattr(args, "own_process", False),
                      err=sys.stderr)  # fmt: skip
    sizes = [_size(s) for s in args.sizes.split(",") if s.strip()]
    names = [a for a in args.algorithms.split(",") if a] or algorithms()
    results: dict[str, Any] = {
        "machine": {
            "cpu": cpu_name(),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "load_average_start": os.getloadavg()[0],
            "device": kind,
            "gpu": torch.cuda.get_device_name() if gpu else None,
        },
        "units": "GB/s of float32 gradient input (4 bytes per element); copy, read and write: "
        "generated probe kernels (the best beside any row); *_torch: dst.copy_(src), src.sum(), "
        "dst.fill_(1.0)",
        "copy": {},
        "read": {},
        "write": {},
        "copy_torch": {},
        "read_torch": {},
        "write_torch": {},
        "kernels": {},
        "philox": {},
    }
    gen = torch.Generator(device=device).manual_seed(0)

    def timed(fn: Fn, reps: int) -> float:
        return best(fn, reps, cuda=gpu)

    print(HEADER)
    for n in sizes:
        x = torch.randn(n, generator=gen, device=device)
        y = torch.empty(n, device=device)
        torch_refs = {"copy": lambda: y.copy_(x), "read": x.sum, "write": lambda: y.fill_(1.0)}  # noqa: B023
        for k, v in _rates(torch_refs, n, timed, args.reps).items():
            results[f"{k}_torch"][str(n)] = v
        probes = _probes(kind, x, y)
        if kind != "emulated":  # the bound of the random algorithms: the RNG alone
            probe = _probe(kind, PHILOX_PROBE)
            results["philox"][str(n)] = _measure(probe, x, y, timed, args.reps, gpu)["encode"]
        for name in names:
            before = _rates(probes, n, timed, args.reps)
            row = _measure(make(name), x, y, timed, args.reps, gpu)
            after = _rates(probes, n, timed, args.reps)
            for k in before:  # the better of the two, and the best of the run
                row[k] = max(before[k], after[k])
                results[k][str(n)] = max(row[k], results[k].get(str(n), 0.0))
            copy, read, write = row["copy"], row["read"], row["write"]
            enc_r, dec_r = row.pop("encode_reads"), row.pop("decode_reads")
            for key in ("decode", "decode_sum2", "decode_sum4"):  # time / the write's time
                row[f"{key}_vs_write"] = write / row[f"{key}_out"]
            # the least a decode of k payloads can take, in write-once times: the output
            # written, and the payloads read at the rate the copy probe reads its input
            for k in (1, 2, 4):
                row[f"sum{k}_bound"] = 1 + k * dec_r / 4 * max(0.0, write / copy - 1)
            row["encode_roofline"] = roofline(copy, read, row["encode_bytes_per_elem"], enc_r, gpu)
            row["decode_roofline"] = roofline(copy, read, row["decode_bytes_per_elem"], dec_r, gpu)
            if not args.no_torch and n % 512 == 0 and not name.endswith(".cll"):
                enc, dec = torch_versions(name, x)
                row["torch_encode"] = 4 * n / timed(enc, max(1, args.reps // 2)) / 1e9
                row["torch_decode"] = 4 * n / timed(dec, max(1, args.reps // 2)) / 1e9
            results["kernels"].setdefault(name, {})[str(n)] = row
            print(_line(name, n, row), flush=True)
    for n_, gbs in results["philox"].items():
        print(f"philox alone (one word per element, nothing read) n={n_}: {gbs:.2f} GB/s")
    results["machine"]["load_average_end"] = os.getloadavg()[0]
    out = Path(args.out)
    stamp(results, getattr(args, "invocation", "hipress bench kernels"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")
    return 0
