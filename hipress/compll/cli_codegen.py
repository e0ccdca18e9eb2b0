"""Code generation commands: ``hipress build`` (render every shipped algorithm's C and CUDA
sources into ``generated/<algorithm>/`` with a manifest of hashes, or check that they are up to
date) and ``hipress bench kernels`` (the kernel throughput benchmark, bench/bench_kernels.py).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from hipress.compll.algorithm import algorithms, load
from hipress.compll.render import BANNER, generator_digest, render

REPO = Path(__file__).resolve().parents[2]
GENERATED = REPO / "generated"
MANIFEST = "MANIFEST.json"
SUFFIX = {"c": ".c", "cuda": ".cu"}


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def render_all() -> dict[str, str]:
    """Relative path -> text of every generated file (sources and manifest), default params."""
    files: dict[str, str] = {}
    manifest: dict[str, Any] = {
        "banner": BANNER,
        "generator": {t: generator_digest(t) for t in SUFFIX},
        "algorithms": {},
    }
    for name in algorithms():
        prog = load(name, backend="reference").program
        entry: dict[str, Any] = {"ir": prog.digest(), "params": dict(prog.params), "files": {}}
        for target, suffix in SUFFIX.items():
            rel = f"{name}/{name}{suffix}"
            text = render(prog, target)
            files[rel] = text
            entry["files"][rel] = _sha(text)
        manifest["algorithms"][name] = entry
    files[MANIFEST] = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    return files


def build_generated(out_dir: Path = GENERATED) -> list[Path]:
    """Write every generated file under ``out_dir`` (stale files of removed algorithms are
    deleted); return the paths written."""
    files = render_all()
    written = []
    for rel, text in files.items():
        p = out_dir / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if not p.exists() or p.read_text() != text:
            p.write_text(text)
        written.append(p)
    keep = {out_dir / rel for rel in files}
    for p in sorted(out_dir.rglob("*")):
        if p.is_file() and p.suffix in (".c", ".cu") and p not in keep:
            p.unlink()
    return written


def check_generated(out_dir: Path = GENERATED) -> list[str]:
    """Relative paths under ``out_dir`` that are missing, different from what the generator
    renders now, or left over; empty when everything is up to date."""
    files = render_all()
    stale = [rel for rel, text in files.items()
             if not (out_dir / rel).is_file() or (out_dir / rel).read_text() != text]  # fmt: skip
    if out_dir.is_dir():
        for p in sorted(out_dir.rglob("*")):
            rel = p.relative_to(out_dir).as_posix()
            if p.is_file() and p.suffix in (".c", ".cu") and rel not in files:
                stale.append(rel)
    return stale


def _cmd_build(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if args.check:
        stale = check_generated(out)
        if stale:
            print(f"{out}: {len(stale)} generated file(s) are stale; run `hipress build`:",
                  file=sys.stderr)  # fmt: skip
            for rel in stale:
                print(f"  {rel}", file=sys.stderr)
            return 1
        print(f"{out}: generated sources are up to date")
        return 0
    written = build_generated(out)
    print(f"wrote {len(written)} file(s) under {out}")
    if args.compile_cuda:
        from hipress.compll.nvrtc import ARCHS, compile_check

        for name in algorithms():
            sizes = compile_check(load(name, backend="reference").program, ARCHS)
            print(f"  {name}: NVRTC ok for {', '.join(f'{a} ({b} B)' for a, b in sizes.items())}")
    return 0


def add_build_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``build``: render generated/<algorithm>/ (``--check``: fail if stale)."""
    p = subparsers.add_parser("build", help="render every shipped algorithm's C and CUDA sources")
    p.add_argument("--out", default=str(GENERATED), help="output directory (default: generated/)")
    p.add_argument("--check", action="store_true", help="fail if the files are stale")
    p.add_argument("--compile-cuda", action="store_true",
                   help="also compile every CUDA source with NVRTC for sm_80 and sm_90")  # fmt: skip
    p.set_defaults(func=_cmd_build)
    return p


def _bench_module() -> Any:
    path = REPO / "bench" / "bench_kernels.py"
    spec = importlib.util.spec_from_file_location("bench_kernels", path)
    if spec is None or spec.loader is None or not path.exists():
        raise FileNotFoundError(f"{path} not found (run from a source checkout)")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _cmd_bench_kernels(args: argparse.Namespace) -> int:
    return int(_bench_module().run(args))


def add_bench_kernels_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``kernels`` under ``bench``: encode/decode GB/s of the C kernels vs torch ops."""
    p = subparsers.add_parser(
        "kernels",
        help="throughput of the generated kernels (C on CPU, CUDA on a GPU) vs plain torch ops, "
        "with the device's copy roofline",
    )
    p.add_argument("--device", choices=("auto", "cpu", "cuda", "emulated"), default="auto",
                   help="auto: cuda where a GPU is available, else cpu; emulated: the CUDA "
                   "kernels on the CPU emulator (checks the benchmark's CUDA path, not speed)")  # fmt: skip
    p.add_argument("--sizes", default="1K,64K,1M,16M,64M",
                   help="element counts (K/M suffixes), comma separated")  # fmt: skip
    p.add_argument("--algorithms", default="", help="comma separated (default: all shipped)")
    p.add_argument("--reps", type=int, default=5, help="timed repetitions (best is reported)")
    p.add_argument("--no-torch", action="store_true", help="skip the torch-ops baselines")
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "kernels.json"))
    p.set_defaults(func=_cmd_bench_kernels)
    return p


def add_parsers(subparsers: Any, bench_subparsers: Any | None = None) -> None:
    """The extension hook of :mod:`hipress.cli`: ``build``, and ``kernels`` under ``bench``."""
    add_build_parser(subparsers)
    if bench_subparsers is not None:
        add_bench_kernels_parser(bench_subparsers)
