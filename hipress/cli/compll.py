"""The CompLL commands: ``hipress check``, ``show``, ``algorithms`` and ``build`` (render every
shipped algorithm's C and CUDA sources into ``generated/<algorithm>/`` with a manifest of hashes,
or check that they are up to date; or render the sources of given ``.cll`` files)."""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from hipress.cli.args import count, parse_params, read_source
from hipress.compll import CllError, algorithms, load
from hipress.compll.algorithm import load_source
from hipress.compll.backends.render import BANNER, generator_digest
from hipress.compll.backends.targets import render
from hipress.compll.frontend.check import check_source, param_combinations
from hipress.compll.frontend.parse import parse
from hipress.compll.ir.show import show_program

REPO = Path(__file__).resolve().parents[2]
GENERATED = REPO / "generated"
MANIFEST = "MANIFEST.json"
SUFFIX = {"c": ".c", "cuda": ".cu"}


def _check_one(file: str) -> str:
    """Check one ``.cll`` file (or shipped name) with its defaults and every parameter
    variant; returns its ``ok`` line, raises :class:`CllError` on the first error."""
    src = read_source(file)
    module = parse(src)
    prog = check_source(src)
    variants = param_combinations(module)
    for v in variants:
        check_source(src, v)
    return (
        f"{file}: ok: algorithm {prog.name}, {len(prog.params)} parameter(s), "
        f"payload {len(prog.payload)} field(s); checked defaults and {len(variants)} "
        "parameter variant(s)"
    )


def _cmd_check(args: argparse.Namespace) -> int:
    """Check every file, as a linter does: each one's result, exit 1 if any fails."""
    failed = 0
    for file in args.files:
        try:
            print(_check_one(file))
        except CllError as exc:
            print(str(exc), file=sys.stderr)
            failed += 1
    if failed and len(args.files) > 1:
        print(f"{failed} of {len(args.files)} file(s) failed", file=sys.stderr)
    return 1 if failed else 0


def _cmd_show(args: argparse.Namespace) -> int:
    params = parse_params(args.param)
    alg = load_source(read_source(args.file), backend="reference", **params)
    if args.ir or not (args.layout):
        print(show_program(alg.program))
    if args.layout:
        from hipress.compll.ir.payload import layout

        fields, total = layout(alg.program, args.n)
        print(f"payload layout for n={args.n}: {total} bytes")
        for f in fields:
            print(
                f"  {f.name:<12} offset {f.offset:>10}  bytes {f.nbytes:>10}  elements {f.length}"
            )
    return 0


def _cmd_algorithms(args: argparse.Namespace) -> int:
    rows = []
    for name in algorithms():
        alg = load(name, backend="reference")
        params = ", ".join(f"{k}={v!r}" for k, v in alg.params.items()) or "-"
        ef = "yes" if alg.error_feedback else "no"
        bits = alg.bits_per_element(args.n)
        rows.append((name, f"{bits:.3f}", ef, params, alg.doc))
    head = ("algorithm", f"bits/elem (n={args.n})", "EF", "parameters", "description")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]
    print("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=False)) + "  " + head[4])
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[4])
    return 0


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
        from hipress.compll.backends.cuda.nvrtc import ARCHS, compile_check

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


def add_parsers(sub: Any) -> None:
    """Add ``check``, ``show``, ``algorithms`` and ``build`` to the top-level group."""
    c = sub.add_parser(
        "check",
        help="check .cll files (all parameter variants)",
        description="Check each FILE with its defaults and every parameter variant; print each "
        "file's result; exit 1 if any fails.",
    )
    c.add_argument("files", nargs="+", metavar="FILE",
                   help="a .cll file, or the name of a shipped algorithm; several allowed")  # fmt: skip
    c.set_defaults(func=_cmd_check)

    s = sub.add_parser("show", help="print a .cll file's IR or payload layout")
    s.add_argument("file", help="a .cll file, or the name of a shipped algorithm")
    s.add_argument("--ir", action="store_true", help="print the IR (default)")
    s.add_argument("--layout", action="store_true", help="print the payload layout")
    s.add_argument("-n", type=count, default=1000, help="element count for --layout")
    s.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="set a parameter (repeatable), e.g. --param bitwidth=4")  # fmt: skip
    s.set_defaults(func=_cmd_show)

    a = sub.add_parser("algorithms", help="list the shipped algorithms")
    a.add_argument("-n", type=count, default=1 << 20, help="element count for bits/element")
    a.set_defaults(func=_cmd_algorithms)

    add_build_parser(sub)
