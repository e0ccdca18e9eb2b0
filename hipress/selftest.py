"""``hipress selftest``: check an installation on the machine it runs on, in one command.

It reports what it found (Python, torch and its CUDA, the GPU and its driver, CuPy, NVRTC, the C
and C++ compilers), then checks, on the device models will train on:

- kernels: every shipped algorithm's kernels against the reference interpreter, bit for bit
  (payload bytes, state, decode, decode-accumulate, the average of payloads), at small and large
  sizes, float32/float16/bfloat16 and strided gradients. On a GPU the CUDA kernels; on a CPU the
  C kernels, and the CUDA kernels on the CPU emulator where a C++ compiler is found.
- speed: encode and decode GB/s of gradient against the device's copy bandwidth, measured now.
- training (launched with ``torchrun --nproc-per-node N``; :mod:`hipress.selftest_dist`), over
  NCCL (CUDA) or gloo (CPU): CaSync as a DDP hook for a few steps of a small model (uncompressed
  equals plain DDP bit for bit; onebit and terngrad, compressing the tensors above CaSync's
  threshold, stay near plain DDP's loss), and hipress.fsdp's compressed reduce-scatter (against
  its reference model bit for bit; on several ranks also through ``fully_shard``, near plain
  FSDP2). Each compressed check reports how much it compressed (``compressed``: tensors,
  reduce-scatters or FSDP units), read back from the state after the run, and fails if nothing.

What it cannot check here it skips, and says why. Exit status 0 when every check that ran
passed. The report is also written as JSON (``--out``).
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hipress.selftest_report import Report
from hipress.timing import best_of

__all__ = ["THRESHOLD_ENV", "Report", "print_report", "run_selftest"]

THRESHOLD_ENV = "HIPRESS_SELFTEST_MIN_COMPRESS_NUMEL"  # see run_selftest


# ---------------------------------------------------------------- what is installed


def environment() -> dict[str, str]:
    from hipress.compll.backends.cache import Toolchain
    from hipress.compll.backends.cuda.emu import CxxToolchain

    found = {"python": platform.python_version(), "torch": torch.__version__,
             "torch CUDA": str(torch.version.cuda or "none (CPU build)")}  # fmt: skip
    if torch.cuda.is_available():
        found["GPU"] = ", ".join(
            torch.cuda.get_device_name(k) for k in range(torch.cuda.device_count())
        )
    else:
        found["GPU"] = "none visible to torch"
    try:
        import cupy as cp  # type: ignore[import-not-found]

        v = cp.cuda.runtime.driverGetVersion()
        found["CuPy"] = f"{cp.__version__} (built for CUDA {cp.cuda.runtime.runtimeGetVersion()})"
        found["NVIDIA driver"] = f"supports CUDA {v // 1000}.{v % 1000 // 10}"
    except Exception as exc:
        found["CuPy"] = f"unavailable ({type(exc).__name__}: {str(exc)[:120]})"
    try:
        import ctypes

        from hipress.compll.backends.cuda.nvrtc import _nvrtc

        major, minor = ctypes.c_int(), ctypes.c_int()
        _nvrtc().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
        found["NVRTC"] = f"{major.value}.{minor.value}"
    except Exception as exc:
        found["NVRTC"] = f"unavailable ({exc})"
    tc, cxx = Toolchain.detect(), CxxToolchain.detect()
    found["C compiler"] = f"{tc.cc}: {tc.version}" if tc else "none ($CC, cc, gcc, clang)"
    found["C++ compiler"] = f"{cxx.cxx}: {cxx.version}" if cxx else "none ($CXX, c++, g++)"
    backends = [b for b in ("gloo", "nccl") if getattr(torch.distributed, f"is_{b}_available")()]
    found["torch.distributed"] = ", ".join(backends) or "none"
    return found


# ---------------------------------------------------------------- kernels


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.reshape(-1).cpu(), b.reshape(-1).cpu()
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if not a.dtype.is_floating_point:
        return torch.equal(a, b)
    return bool(((a == b) & (a.signbit() == b.signbit()) | (a.isnan() & b.isnan())).all())


def compare(ref: Any, alg: Any, x: torch.Tensor, device: torch.device, steps: int = 2) -> None:
    """``alg`` on ``device`` against the reference ``ref`` on the CPU; raises on a difference."""
    n = x.numel()
    s1 = ref.init_state(n, seed=3, tensor_id=5)
    s2 = alg.init_state(n, seed=3, tensor_id=5, device=device)
    sent = []
    for step in range(steps):
        p1, p2 = ref.encode(x.cpu(), s1), alg.encode(x.to(device), s2)
        if not torch.equal(p1, p2.cpu()):
            raise AssertionError(f"{alg.name} n={n} {x.dtype} step {step}: payload bytes differ")
        for k in s1.tensors:
            if not _same(s1.tensors[k], s2.tensors[k]):
                raise AssertionError(f"{alg.name} n={n}: state `{k}` differs")
        for acc in (False, True):
            o1 = torch.linspace(-1, 1, n)
            o2 = o1.to(device)
            ref.decode(p1, n, o1, accumulate=acc)
            alg.decode(p1.to(device), n, o2, accumulate=acc)
            if not _same(o1, o2):
                raise AssertionError(f"{alg.name} n={n}: decode (accumulate={acc}) differs")
        sent.append(p1)
    want = ref.decode_sum(sent, n, divide_by=len(sent))
    got = alg.decode_sum([p.to(device) for p in sent], n, divide_by=len(sent))
    if not _same(want, got):
        raise AssertionError(f"{alg.name} n={n}: decode_sum differs")


def _inputs(sizes: tuple[int, ...]) -> list[torch.Tensor]:
    out = []
    for n in sizes:
        x = torch.randint(-64, 64, (2 * n,), generator=torch.Generator().manual_seed(n)) / 8
        x = x.float()
        x[::97] = -0.0
        out += [x[:n], x[:n].half(), x[:n].bfloat16(), x[::2]]  # the last one strided
    return out


def kernel_checks(report: Report, device: torch.device, sizes: tuple[int, ...],
                  make: Callable[[str], Any], label: str) -> None:  # fmt: skip
    from hipress.compll import algorithms, load

    xs = _inputs(sizes)
    for name in algorithms():

        def run(name: str = name) -> None:
            ref, alg = load(name, backend="reference"), make(name)
            for x in xs:
                compare(ref, alg, x, device)

        report.check(f"{label} kernels = reference: {name}", run)


def no_waits(device: torch.device) -> None:
    """Encode, decode and decode_sum of the sparsifiers and onebit under
    ``torch.cuda.set_sync_debug_mode("error")``: any host synchronisation raises."""
    from hipress.compll import load

    n = 1 << 20
    x = torch.randn(n, device=device)
    out = torch.empty(n, device=device)
    for name in ("onebit", "topk", "dgc", "randomk"):
        alg = load(name, backend="cuda")
        st = alg.init_state(n, device=device)
        p = alg.encode(x, st)  # the first calls compile and allocate
        alg.decode_sum([p, p], n, out=out, divide_by=2)
        torch.cuda.synchronize(device)
        torch.cuda.set_sync_debug_mode("error")
        try:
            alg.encode_checked(x, st, out=p)
            alg.decode(p, n, out, accumulate=True)
            alg.decode_sum([p, p], n, out=out, divide_by=2)
        finally:
            torch.cuda.set_sync_debug_mode("default")


# ---------------------------------------------------------------- speed


def speed(report: Report, device: torch.device, n: int, make: Callable[[str], Any]) -> None:
    from hipress.compll import algorithms

    cuda = device.type == "cuda"

    def best(fn: Callable[[], object], reps: int = 5) -> float:
        return best_of(fn, reps, cuda)

    x = torch.randn(n, device=device)
    y = torch.empty(n, device=device)
    copy = 4 * n / best(lambda: y.copy_(x)) / 1e9
    rows = {}
    for name in algorithms():
        alg = make(name)
        st = alg.init_state(n, device=device)
        pay = torch.empty(alg.payload_nbytes(n), dtype=torch.uint8, device=device)
        enc = 4 * n / best(lambda a=alg, s=st, p=pay: a.encode(x, s, p)) / 1e9
        dec = 4 * n / best(lambda a=alg, p=pay: a.decode(p, n, y)) / 1e9
        rows[name] = {"encode": round(enc, 2), "decode": round(dec, 2),
                      "encode_of_copy": round(enc / copy, 3)}  # fmt: skip
    report.speed = {"device": str(device), "floats": n, "copy": round(copy, 2),
                    "units": "GB/s of float32 gradient", "algorithms": rows}  # fmt: skip


# ---------------------------------------------------------------- the command


def run_selftest(quick: bool = False, out: Path | None = None,
                 min_compress_numel: int | None = None) -> Report:  # fmt: skip
    """Run every check this machine allows (see module doc); return the report.

    ``min_compress_numel`` is the compression threshold of the checks under torchrun (default:
    ``$HIPRESS_SELFTEST_MIN_COMPRESS_NUMEL``, else CaSync's and hipress.fsdp's own); one above
    every tensor makes them compress nothing, and fail."""
    import torch.distributed as dist

    from hipress.compll import Algorithm, load
    from hipress.compll.backends.cuda.emu import CxxToolchain

    report = Report(found=environment())
    launched = "WORLD_SIZE" in os.environ and "RANK" in os.environ
    gpu = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if gpu else None
    if device is not None:
        torch.cuda.set_device(device)
    sizes = (1, 9, 70_001) if quick else (1, 9, 70_001, (1 << 20) + 7)
    if gpu:
        assert device is not None

        on_gpu = _prepared_in_parallel(report, device)
        kernel_checks(report, device, sizes, on_gpu, "CUDA")
        report.check("CUDA calls never wait for the device", lambda: no_waits(device))
        speed(report, device, (1 << 22) if quick else (1 << 26), on_gpu)
    else:
        cpu = torch.device("cpu")
        report.checks["CUDA kernels on a GPU"] = "skipped: no GPU visible to torch"
        kernel_checks(report, cpu, sizes[:3], lambda n: load(n, backend="cpu"), "C")
        if CxxToolchain.detect() is not None:
            from hipress.compll.backends.cuda.emu import emulated_backend

            def emulated(name: str) -> Any:
                prog = load(name, backend="reference").program
                return Algorithm(prog, emulated_backend(prog, blocks=3, shuffle=True))

            kernel_checks(report, cpu, sizes[:2], emulated, "CUDA (emulated on the CPU)")
        else:
            report.checks["CUDA kernels (emulated)"] = "skipped: no C++ compiler"
        speed(report, cpu, 1 << 20 if quick else 1 << 24, lambda n: load(n, backend="cpu"))
    if launched:
        from hipress.selftest_dist import fsdp_checks, training_checks

        backend = "nccl" if gpu else "gloo"
        if not dist.is_initialized():
            dist.init_process_group(backend)
        if min_compress_numel is None and os.environ.get(THRESHOLD_ENV):
            min_compress_numel = _threshold(report, os.environ[THRESHOLD_ENV])
        on = device or torch.device("cpu")
        training_checks(report, on, min_compress_numel)
        fsdp_checks(report, on, min_compress_numel)
        import gc

        gc.collect()  # every DDP model and hook state gone before the group
        dist.barrier()
        dist.destroy_process_group()
    else:
        report.checks["training over DDP"] = (
            "skipped: run under torchrun --nproc-per-node N to check it"
        )
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        rank = os.environ.get("RANK", "0")
        path = out if not launched else out.with_name(f"{out.stem}-rank{rank}{out.suffix}")
        path.write_text(json.dumps({"found": report.found, "checks": report.checks,
                                    "figures": report.figures, "speed": report.speed,
                                    "ok": report.ok}, indent=2) + "\n")  # fmt: skip
    return report


def _prepared_in_parallel(report: Report, device: torch.device) -> Callable[[str], Any]:
    """Every shipped algorithm with its kernels for ``device`` built on parallel threads (as
    registration builds them); returns name -> algorithm, which raises that algorithm's build
    error. The wall time goes in ``report.found``."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from hipress.compll import algorithms, load

    def build(name: str) -> Any:
        return load(name).build_kernels(device)

    t0 = time.perf_counter()
    names = algorithms()
    with ThreadPoolExecutor(min(8, len(names))) as pool:
        futures = {n: pool.submit(build, n) for n in names}
    report.found["kernel build"] = (
        f"{time.perf_counter() - t0:.1f} s for {len(names)} algorithms on {device} "
        "(parallel; from the kernel cache where they are there)"
    )
    return lambda name: futures[name].result()


def _threshold(report: Report, text: str) -> int | None:
    """``$HIPRESS_SELFTEST_MIN_COMPRESS_NUMEL`` as a number, else None and a failed check."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        report.checks[THRESHOLD_ENV] = f"FAIL: must be a whole number >= 1, got {text!r}"
        return None
    return value


def print_report(report: Report, stream: Any = sys.stdout) -> None:
    w = max(len(k) for k in report.found)
    print("found:", file=stream)
    for k, v in report.found.items():
        print(f"  {k:<{w}}  {v}", file=stream)
    print("checks:", file=stream)
    for k, v in report.checks.items():
        figures = ", ".join(f"{f} {x}" for f, x in report.figures.get(k, {}).items())
        print(f"  {'ok  ' if v == 'pass' else '----' if v.startswith('skip') else 'FAIL'} {k}"
              f"{'' if v == 'pass' else ': ' + v}{f' [{figures}]' if figures else ''}",
              file=stream)  # fmt: skip
    sp = report.speed
    if sp:
        print(f"speed on {sp['device']}, {sp['floats']} floats ({sp['units']}; copy "
              f"{sp['copy']}):", file=stream)  # fmt: skip
        print(f"  {'algorithm':<10} {'encode':>8} {'decode':>8} {'encode/copy':>12}", file=stream)
        for name, r in sp["algorithms"].items():
            print(f"  {name:<10} {r['encode']:>8} {r['decode']:>8} {r['encode_of_copy']:>12}",
                  file=stream)  # fmt: skip
    print("selftest: " + ("every check that ran passed" if report.ok else "FAILED"), file=stream)
