"""The ``hipress`` command line: every subcommand, registered here by name. A subcommand module
that fails to import fails the whole command, so a broken one cannot go missing silently."""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from collections.abc import Sequence

import hipress
from hipress.cli import bench, casync, charts, compll, demo, secopa, secopa_plan, selftest, trace
from hipress.cli.checks import check_args
from hipress.cli.checktable import RULES
from hipress.cli.options import add_verbose_everywhere, print_deprecations
from hipress.cli.signals import stop_on_signals, stopped_message
from hipress.cli.waitpolicy import started_as_hipress
from hipress.compll import CllError

__all__ = ["EXIT_BROKEN_PIPE", "build_parser", "main"]

# the shell's status of a command ended by SIGPIPE (128 + 13), as `yes | head -1` gives `yes`
EXIT_BROKEN_PIPE = 141


def build_parser() -> argparse.ArgumentParser:
    """The parser of every ``hipress`` subcommand; each sets ``func``, its handler."""
    p = argparse.ArgumentParser(
        prog="hipress",
        description="Compression-aware data-parallel training: CompLL, SeCoPa, CaSync.",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    p.add_argument(
        "-V", "--version", action="version", version=f"%(prog)s {hipress.__version__}",
        help="print the version and exit",
    )  # fmt: skip
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    compll.add_parsers(sub)  # check, show, algorithms, build
    selftest.add_parser(sub)
    secopa_plan.add_plan_parser(sub)
    secopa.add_parsers(sub)  # profile
    demo.add_parser(sub)
    trace.add_parser(sub)
    charts.add_parser(sub)
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


def _quiet_stdout() -> None:
    """Point stdout at the null device, so the interpreter's last flush does not fail again on
    the closed pipe (and print a traceback of its own)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):  # not a file (a test's capture)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``hipress ARGV`` (default: the process's arguments); returns the exit status
    (:data:`EXIT_BROKEN_PIPE` when the output's reader closed it, e.g. ``| head``)."""
    own_process = argv is None and started_as_hipress()
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    args.invocation = shlex.join(["hipress", *argv])
    args.own_process = own_process  # may execute itself again (hipress.cli.waitpolicy)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        refused = check_args(parser, args, RULES)  # every option, before any work starts
        if refused is not None:
            return refused
        with stop_on_signals():  # SIGTERM and SIGINT unwind: workers, namespaces, temp files
            status = int(args.func(args) or 0)
        sys.stdout.flush()  # a reader that went away (`| head`) shows here, not at exit
        return status
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_BROKEN_PIPE
    except CllError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        name = " ".join(
            ["hipress", *(str(v) for v in (args.command, getattr(args, "bench", None)) if v)]
        )
        text, status = stopped_message(name, exc)
        print(text, file=sys.stderr)
        return status
    finally:
        print_deprecations(args)


if __name__ == "__main__":
    sys.exit(main())
