"""Every option of the long-running commands, checked before any work starts.

Each command's options have a rule (:mod:`hipress.cli.checktable`): a number's range, a name
among those that exist, a plan or profile file that loads, a result path that can be written.
:func:`check_args` runs them right after parsing; a value a rule refuses ends the command the
way argparse does (the usage, then one line ``hipress bench sync: error: argument --reps: -1 is
out of range (allowed: an integer from 1 to 10000)``, status 2, returned by ``main``), so a bad flag never costs
a baseline run, and never ends in a traceback.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "NETSIM_MAX_WORKERS",
    "WORKER_MEMORY",
    "Int",
    "Num",
    "Rule",
    "UsageError",
    "check_args",
    "check_out",
    "max_workers",
    "name_patterns",
    "subparser",
]

NETSIM_MAX_WORKERS = 250  # ShapedNetwork's addresses: one /24 inside the namespaces
WORKER_MEMORY = 256 << 20  # what a worker process with torch loaded needs at the least


class UsageError(ValueError):
    """A value a command cannot run with: the option, the value, what is wrong and what is
    allowed, on one line."""

    def __init__(self, flag: str, value: Any, problem: str, allowed: str) -> None:
        shown = value if isinstance(value, int | float) else repr(str(value))
        text = f"argument {flag}: {shown} {problem} (allowed: {allowed})"
        super().__init__(" ".join(text.split()))
        self.flag, self.value, self.allowed = flag, value, allowed


def max_workers() -> int:
    """The most worker processes a benchmark may start here: a network namespace each (at most
    :data:`NETSIM_MAX_WORKERS`) and :data:`WORKER_MEMORY` of this machine's memory each."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return NETSIM_MAX_WORKERS
    return max(2, min(NETSIM_MAX_WORKERS, memory // WORKER_MEMORY))


def workers_allowed(lo: int = 2) -> str:
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"an integer from {lo} to {max_workers()} on this machine: a network namespace each "
        f"(at most {NETSIM_MAX_WORKERS}) and {WORKER_MEMORY >> 20} MiB of its {mem:.0f} GiB of "
        "memory each"
    )


def cpus() -> int:
    """Threads one process may ask for: this machine's CPUs."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class Rule:
    """A check of one option's parsed value; ``check`` raises :class:`UsageError`."""

    def check(self, flag: str, value: Any, args: argparse.Namespace) -> None:
        raise NotImplementedError


def _items(value: Any) -> list[Any]:
    if isinstance(value, list | tuple):
        return list(value)
    return [value]


@dataclass(frozen=True)
class Int(Rule):
    """An integer (or each of a list's) from ``lo`` to ``hi`` (a callable: computed now);
    None passes where ``none`` is set."""

    lo: int
    hi: int | Callable[[], int]
    none: bool = False
    allowed: Callable[[], str] | None = None

    def check(self, flag: str, value: Any, args: argparse.Namespace) -> None:
        hi = self.hi() if callable(self.hi) else self.hi
        allowed = self.allowed() if self.allowed else f"an integer from {self.lo} to {hi}"
        for v in _items(value):
            if v is None and self.none:
                continue
            if not isinstance(v, int) or isinstance(v, bool) or not self.lo <= v <= hi:
                raise UsageError(flag, v, "is out of range", allowed)


@dataclass(frozen=True)
class Num(Rule):
    """A finite number from ``lo`` to ``hi`` (``lo`` itself excluded with ``open_lo``);
    None passes where ``none`` is set, and so does each of ``also`` (``0``: off)."""

    lo: float
    hi: float
    open_lo: bool = False
    none: bool = False
    also: tuple[float, ...] = ()
    unit: str = ""

    def check(self, flag: str, value: Any, args: argparse.Namespace) -> None:
        low = f"above {self.lo:g}" if self.open_lo else f"from {self.lo:g}"
        extra = "".join(f" or {a:g}" for a in self.also)
        allowed = f"a number {low} to {self.hi:g}{self.unit}{extra}"
        for v in _items(value):
            if (v is None and self.none) or v in self.also:
                continue
            bad = v is None or not math.isfinite(v) or v > self.hi or v < self.lo
            if bad or (self.open_lo and v == self.lo):
                raise UsageError(flag, v, "is out of range", allowed)


@dataclass(frozen=True)
class Names(Rule):
    """Each name of a comma list (a string or a parsed list) among ``names()``; ``extra``
    are the other words allowed (``all``); ``empty``: an empty list is allowed."""

    names: Callable[[], Iterable[str]]
    what: str
    extra: tuple[str, ...] = ()
    empty: bool = False
    colon: bool = False  # ``NAME:OPTION`` entries: NAME is checked

    def check(self, flag: str, value: Any, args: argparse.Namespace) -> None:
        words = value.split(",") if isinstance(value, str) else _items(value)
        words = [w.strip() for w in words if w is not None and str(w).strip()]
        known = sorted(self.names())
        allowed = ", ".join([*self.extra, *known])
        if not words and not self.empty:
            raise UsageError(flag, value, f"names no {self.what}", allowed)
        for w in words:
            if w in self.extra and len(words) == 1:
                continue
            if (w.partition(":")[0] if self.colon else w) not in known:
                raise UsageError(flag, w, f"is not a known {self.what}", allowed)


@dataclass(frozen=True)
class Call(Rule):
    """Any other check: ``fn(flag, value, args)`` raises :class:`UsageError`."""

    fn: Callable[[str, Any, argparse.Namespace], None]

    def check(self, flag: str, value: Any, args: argparse.Namespace) -> None:
        self.fn(flag, value, args)


def _nearest_existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _probe_dir(flag: str, value: Any, folder: Path, allowed: str) -> None:
    """Raise unless a file can be created in ``folder`` or in the folders to be made there."""
    base = _nearest_existing(folder)
    if not base.is_dir():
        raise UsageError(flag, value, f"cannot be made: {base} is not a directory", allowed)
    try:
        with tempfile.TemporaryFile(dir=base):
            pass
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise UsageError(flag, value, f"cannot be written: {base}: {why}", allowed) from None


def name_patterns(flag: str, value: Any, args: argparse.Namespace) -> None:
    """Parameter names or fnmatch patterns of them, comma-separated: letters, digits and
    ``_ . * ? [ ] ! -`` only."""
    for v in str(value).split(","):
        if re.fullmatch(r"[\w.*?\[\]!-]*", v, flags=re.ASCII) is None:
            raise UsageError(flag, v, "is not a parameter name pattern",
                             "names of named_parameters() or fnmatch patterns, comma-separated")  # fmt: skip


def check_out(flag: str, value: Any, kind: str) -> None:
    """A result path that can be written: ``kind`` "dir" (a folder, made if missing) or "file"
    (a file, its folder made if missing). Nothing is created."""
    if value is None:
        return
    path = Path(value)
    allowed = f"a writable {'directory' if kind == 'dir' else 'file path'}"
    if str(value).strip() == "":
        raise UsageError(flag, value, "is empty", allowed)
    if "\0" in str(value):
        raise UsageError(flag, value, "holds a NUL character", allowed)
    if kind == "dir":
        if path.exists() and not path.is_dir():
            raise UsageError(flag, value, "is not a directory", allowed)
        _probe_dir(flag, value, path, allowed)
        return
    if path.is_dir() or str(value).endswith(os.sep):
        raise UsageError(flag, value, "is a directory, not a file", allowed)
    if path.exists():
        try:
            with open(path, "r+b"):
                pass
        except OSError as exc:
            raise UsageError(flag, value, f"cannot be written: {exc.strerror}", allowed) from None
        return
    _probe_dir(flag, value, path.parent, allowed)


def _path_of(args: argparse.Namespace) -> tuple[str, ...]:
    return tuple(v for v in (getattr(args, "command", None), getattr(args, "bench", None)) if v)


def subparser(parser: argparse.ArgumentParser, path: Iterable[str]) -> argparse.ArgumentParser:
    """The parser of the subcommand at ``path`` (``("bench", "sync")``) under ``parser``."""
    for name in path:
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                parser = a.choices[name]
                break
    return parser


def option_of(p: argparse.ArgumentParser, dest: str) -> str:
    """The long option (else the first) that stores into ``dest`` (visible ones first)."""
    found = [a for a in p._actions if a.dest == dest and a.option_strings]
    found.sort(key=lambda a: a.help == argparse.SUPPRESS)
    if not found:
        return dest
    opts = found[0].option_strings
    return next((o for o in opts if o.startswith("--")), opts[0])


def check_args(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    table: dict[tuple[str, ...], dict[str, Rule]],
) -> int | None:
    """Run the rules ``table`` has for the parsed command's options (dest -> rule, by the
    command's path: :data:`hipress.cli.checktable.RULES`). On the first refusal print what argparse
    prints for a bad value (the subcommand's usage, then one line ``PROG: error: argument
    --FLAG: ...``) on stderr and return 2, argparse's status; else return None."""
    from hipress.cli.options import spelled

    path = _path_of(args)
    rules = table.get(path)
    if not rules:
        return None
    sub = subparser(parser, path)
    try:
        for dest, rule in rules.items():
            if hasattr(args, dest):
                flag = spelled(args, dest, option_of(sub, dest))
                rule.check(flag, getattr(args, dest), args)
    except UsageError as exc:
        sub.print_usage(sys.stderr)
        print(f"{sub.prog}: error: {exc}", file=sys.stderr)
        return 2
    return None
