"""Time one gradient synchronisation: DDP allreduce vs CaSync's strategies, algorithms and K.

Same as ``hipress bench sync``; prints a table and writes ``bench/results/sync.json``.

    python bench/bench_sync.py                      # 2 and 4 workers, 1 KB .. 256 MB, loopback
    python bench/bench_sync.py --quick              # smoke run
    python bench/bench_sync.py --rates loopback 1000   # also 1 Gbit/s shaped links (root)
"""

from __future__ import annotations

import argparse
import logging
import sys

from hipress.casync.cli import add_sync_arguments, run_bench_sync


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_sync_arguments(parser)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    return run_bench_sync(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
