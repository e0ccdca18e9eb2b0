"""The ``hipress`` command line. Owns all output; the library only logs.

:mod:`~hipress.cli.commands` registers every subcommand and runs one (:func:`main`); one module
per area adds its parsers: :mod:`~hipress.cli.compll` (check, show, algorithms, build),
:mod:`~hipress.cli.secopa` (plan, profile, bench plan), :mod:`~hipress.cli.casync` (bench sync),
:mod:`~hipress.cli.bench` (the other benchmarks and the docs' tables), :mod:`~hipress.cli.demo`,
:mod:`~hipress.cli.selftest`; :mod:`~hipress.cli.args` reads the arguments they share,
:mod:`~hipress.cli.options` holds the option conventions (one name per concept, comma lists,
deprecated aliases), :mod:`~hipress.cli.progress` shows long steps' progress,
:mod:`~hipress.cli.planreport` prints plans, profiles and what a plan's costs rest on,
:mod:`~hipress.cli.waitpolicy` times kernels under OpenMP's passive wait,
:mod:`~hipress.cli.checks` (with the rules of :mod:`~hipress.cli.checktable`) checks every
option before a command starts, and :mod:`~hipress.cli.signals` makes SIGTERM and SIGINT
unwind a command so that it cleans up.
"""

from __future__ import annotations

from hipress.cli.commands import build_parser, main

__all__ = ["build_parser", "main"]
