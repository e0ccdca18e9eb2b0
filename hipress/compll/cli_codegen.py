"""Code generation commands: ``hipress build`` (render every shipped algorithm's C and CUDA
sources into ``generated/<algorithm>/`` with a manifest of hashes, or check that they are up to
date; or render the sources of given ``.cll`` files) and ``hipress bench kernels`` (the kernel
throughput benchmark, bench/bench_kernels.py). Also the argument readers the CompLL commands
share: a ``.cll`` file or a shipped algorithm's name, ``--param NAME=VALUE``, element counts.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from hipress.compll.algorithm import algorithms, load, load_source, shipped_path
from hipress.compll.calls import MAX_ELEMENTS
from hipress.compll.render import BANNER, generator_digest, render
from hipress.compll.source import CllError, SourceFile

REPO = Path(__file__).resolve().parents[2]
GENERATED = REPO / "generated"
MANIFEST = "MANIFEST.json"
SUFFIX = {"c": ".c", "cuda": ".cu"}


def read_source(arg: str) -> SourceFile:
    """A ``.cll`` file, or a shipped algorithm given by name (``hipress show terngrad``)."""
    path = Path(arg)
    if not path.exists() and arg in algorithms():
        path = shipped_path(arg)
    elif not path.exists() and "/" not in arg and not arg.endswith(".cll"):
        raise CllError(
            f"{arg}: no such file, nor a shipped algorithm (shipped: {', '.join(algorithms())})"
        )
    return SourceFile.read(path)


def parse_params(items: list[str]) -> dict[str, object]:
    """``--param NAME=VALUE`` items: true/false, integers, then floats (``nan``, ``1e-3``)."""
    out: dict[str, object] = {}
    for item in items:
        if "=" not in item:
            raise CllError(f"--param expects NAME=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        low = v.strip().lower()
        val: object
        if low in ("true", "false"):
            val = low == "true"
        else:
            try:
                val = int(v)
            except ValueError:
                try:
                    val = float(v)
                except ValueError:
                    raise CllError(f"--param {k}: {v!r} is not a number or bool") from None
        out[k.strip()] = val
    return out


def count(text: str) -> int:
    """An argparse type: an element count in [0, 2**40]."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 0 <= v <= MAX_ELEMENTS:
        raise argparse.ArgumentTypeError(f"{text} is not an element count in [0, 2**40]")
    return v


def build_files(files: list[str], params: dict[str, object], out_dir: Path) -> list[Path]:
    """Render the C and CUDA sources of each ``.cll`` file (or shipped name) with ``params``
    into ``out_dir/<algorithm>/``; return the paths written."""
    written = []
    for arg in files:
        prog = load_source(read_source(arg), backend="reference", **params).program
        for target, suffix in SUFFIX.items():
            p = out_dir / prog.name / f"{prog.name}{suffix}"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(render(prog, target))
            written.append(p)
    return written


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
    if args.files:
        if args.check:
            raise CllError("--check compares the shipped algorithms' generated/ sources: no FILE")
        paths = build_files(args.files, parse_params(args.param), Path(args.out or "."))
        for p in paths:
            print(f"wrote {p}")
        return 0
    if args.param:
        raise CllError("--param needs a FILE: the shipped sources use default parameters")
    out = Path(args.out or GENERATED)
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
    p = subparsers.add_parser(
        "build",
        help="render the C and CUDA sources of .cll files (default: of every shipped algorithm)",
    )
    p.add_argument("files", nargs="*", metavar="FILE",
                   help="a .cll file or a shipped algorithm's name; its sources go to "
                   "OUT/<algorithm>/ (default: every shipped algorithm, into generated/)")  # fmt: skip
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="a parameter of the FILEs, e.g. --param bitwidth=4")  # fmt: skip
    p.add_argument("--out", default=None,
                   help="output directory (default: generated/, or . with FILEs)")  # fmt: skip
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
