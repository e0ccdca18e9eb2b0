"""`hipress bench convergence` as a script (same options): `python bench/bench_convergence.py [-v] --help`."""

from __future__ import annotations

import argparse
import logging
import sys

from hipress.bench.cli import add_parsers


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench_convergence.py")
    sub = parser.add_subparsers(dest="bench", required=True)
    add_parsers(sub, sub)
    verbose = bool({"-v", "--verbose"} & set(argv))
    args = parser.parse_args(["convergence", *(a for a in argv if a not in ("-v", "--verbose"))])
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
