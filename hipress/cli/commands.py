"""The ``hipress`` command line: every subcommand, registered here by name. A subcommand module
that fails to import fails the whole command, so a broken one cannot go missing silently."""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from collections.abc import Sequence

import hipress
from hipress.cli import bench, casync, compll, demo, secopa, selftest, trace
from hipress.cli.options import add_verbose_everywhere, print_deprecations
from hipress.compll import CllError

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The parser of every ``hipress`` subcommand; each sets ``func``, its handler."""
    p = argparse.ArgumentParser(
        prog="hipress",
        description="Compression-aware data-parallel training: CompLL, SeCoPa, CaSync.",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    p.add_argument(
        "--version", action="version", version=f"%(prog)s {hipress.__version__}",
        help="print the version and exit",
    )  # fmt: skip
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    compll.add_parsers(sub)  # check, show, algorithms, build
    selftest.add_parser(sub)
    secopa.add_parsers(sub)  # plan, profile
    demo.add_parser(sub)
    trace.add_parser(sub)
    b = sub.add_parser("bench", help="benchmarks (print a table, write hipress-results/)")
    bench_sub = b.add_subparsers(dest="bench", required=True, metavar="BENCH")
    bench.add_kernels_parser(bench_sub)
    secopa.add_bench_plan_parser(bench_sub)
    casync.add_bench_sync_parser(bench_sub)
    bench.add_e2e_parsers(bench_sub)
    bench.add_study_parsers(bench_sub)
    bench.add_report_parser(bench_sub)
    add_verbose_everywhere(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``hipress ARGV`` (default: the process's arguments); returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    args.invocation = shlex.join(["hipress", *argv])
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
    finally:
        print_deprecations(args)


if __name__ == "__main__":
    sys.exit(main())
