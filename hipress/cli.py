"""The ``hipress`` command line. Owns all output; the library only logs."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable, Sequence

from hipress.compll import CllError, algorithms, load
from hipress.compll.algorithm import load_source
from hipress.compll.check import check_source, param_variants
from hipress.compll.cli_codegen import count, parse_params, read_source
from hipress.compll.ir import show_program
from hipress.compll.parse import parse


def _cmd_check(args: argparse.Namespace) -> int:
    src = read_source(args.file)
    module = parse(src)
    prog = check_source(src)
    variants = param_variants(module)
    for v in variants:
        check_source(src, v)
    print(
        f"{args.file}: ok: algorithm {prog.name}, {len(prog.params)} parameter(s), "
        f"payload {len(prog.payload)} field(s); checked defaults and {len(variants)} "
        "parameter variant(s)"
    )
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    params = parse_params(args.param)
    alg = load_source(read_source(args.file), backend="reference", **params)
    if args.ir or not (args.layout):
        print(show_program(alg.program))
    if args.layout:
        from hipress.compll.payload import layout

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


def _cmd_selftest(args: argparse.Namespace) -> int:
    import os
    from pathlib import Path

    from hipress.selftest import print_report, run_selftest

    report = run_selftest(quick=args.quick, out=Path(args.out))
    if os.environ.get("RANK", "0") == "0" or not report.ok:
        print_report(report)
    return 0 if report.ok else 1


# Subcommands owned by other parts register here: (module, function adding the parser).
_EXTENSIONS: tuple[tuple[str, str], ...] = (
    ("hipress.compll.cli_codegen", "add_parsers"),
    ("hipress.secopa.cli", "add_parsers"),
    ("hipress.casync.cli", "add_parsers"),
    ("hipress.demo.cli", "add_parsers"),
    ("hipress.bench.cli", "add_parsers"),
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hipress",
        description="Compression-aware data-parallel training: CompLL, SeCoPa, CaSync.",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    c = sub.add_parser("check", help="check a .cll file (all parameter variants)")
    c.add_argument("file", help="a .cll file, or the name of a shipped algorithm")
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

    t = sub.add_parser(
        "selftest",
        help="check this installation: kernels against the reference on this device, their "
        "speed, and (under torchrun) the DDP hook against plain DDP",
    )
    t.add_argument("--quick", action="store_true", help="smaller sizes (about a minute)")
    t.add_argument("--out", default="hipress-results/selftest.json",
                   help="where to write the report as JSON")  # fmt: skip
    t.set_defaults(func=_cmd_selftest)

    bench = sub.add_parser("bench", help="benchmarks (print a table, write bench/results/*.json)")
    bench_sub = bench.add_subparsers(dest="bench", required=True, metavar="BENCH")
    for mod_name, fn_name in _EXTENSIONS:
        try:
            mod = importlib.import_module(mod_name)
        except ImportError:
            continue
        add: Callable[..., None] | None = getattr(mod, fn_name, None)
        if add is not None:
            add(sub, bench_sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args) or 0)
    except CllError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
