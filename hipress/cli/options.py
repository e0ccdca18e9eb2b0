"""The option conventions every subcommand shares.

- One name per concept: ``--workers`` for the process count (``--workers 4``, or
  ``--workers 2,4,8`` where a command takes several), ``--bandwidth`` for a link's rate with its
  unit (``10gbit``, ``100mbit``; ``loopback`` where an unshaped network is an option).
- Lists are comma-separated (``--sizes 1K,64M``).
- Old spellings stay as hidden aliases (:func:`add_alias`): they still work, and the command
  ends with a one-line deprecation warning on stderr naming the new spelling (collected in
  ``args.deprecations`` while parsing, printed by :func:`print_deprecations` after the command
  ran, so a command's own first lines and errors stay first). The spelling a user typed is kept
  in ``args.spelled`` (dest -> option) so messages can name it.
- ``-v``/``--verbose`` is accepted after the subcommand too (:func:`add_verbose_everywhere`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

__all__ = [
    "CommaList",
    "Deprecated",
    "ListHelpFormatter",
    "add_alias",
    "add_verbose_everywhere",
    "print_deprecations",
    "spelled",
    "walk",
]


def _deprecated(namespace: argparse.Namespace, text: str) -> None:
    seen = list(getattr(namespace, "deprecations", []))
    if text not in seen:
        seen.append(text)
    namespace.deprecations = seen


def print_deprecations(args: argparse.Namespace, err: TextIO | None = None) -> None:
    """Print the deprecation warnings parsing collected, one line each (on stderr)."""
    for text in getattr(args, "deprecations", []):
        print(f"hipress: warning: {text}", file=err or sys.stderr)


def _remember(namespace: argparse.Namespace, dest: str, option: str | None) -> None:
    seen = dict(getattr(namespace, "spelled", {}))
    seen[dest] = option or dest
    namespace.spelled = seen


def spelled(args: argparse.Namespace, dest: str, default: str) -> str:
    """The option the user typed for ``dest`` (an old alias, if that was it), else ``default``."""
    return str(getattr(args, "spelled", {}).get(dest, default))


class Deprecated(argparse.Action):
    """A hidden old spelling of an option: warns once, converts, stores into the new ``dest``.

    Extra arguments: ``new`` (how to write it now, for the warning) and ``convert`` (applied
    to the parsed value, to turn the old format into the new one).
    """

    def __init__(
        self,
        option_strings: Sequence[str],
        dest: str,
        new: str = "",
        convert: Callable[[Any], Any] | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs["help"] = argparse.SUPPRESS
        kwargs.setdefault("default", argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kwargs)
        self.new, self.convert = new, convert

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        _deprecated(namespace, f"{option_string} is deprecated; use {self.new}")
        try:
            value = self.convert(values) if self.convert else values
        except (argparse.ArgumentTypeError, ValueError, OverflowError) as exc:
            parser.error(f"argument {option_string}: {exc}")
        setattr(namespace, self.dest, value)
        _remember(namespace, self.dest, option_string)


def add_alias(
    p: argparse.ArgumentParser | Any, old: str, dest: str, new: str, **kwargs: Any
) -> None:
    """Add ``old`` as a hidden deprecated spelling storing into ``dest`` (see
    :class:`Deprecated`); ``kwargs`` as for ``add_argument`` plus ``convert``."""
    p.add_argument(old, dest=dest, action=Deprecated, new=new, **kwargs)


class CommaList(argparse.Action):
    """A comma-separated list option (``--sizes 1K,64M``), each item read by ``item``.

    Takes ``nargs="+"`` so the older space-separated form (``--sizes 1K 64M``) still parses;
    that form prints a deprecation warning. ``choices`` is checked per item.
    """

    def __init__(
        self,
        option_strings: Sequence[str],
        dest: str,
        item: Callable[[str], Any] = str,
        **kwargs: Any,
    ) -> None:
        self.item_choices = kwargs.pop("choices", None)
        kwargs["nargs"] = "+"
        super().__init__(option_strings, dest, **kwargs)
        self.item = item

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        words = [values] if isinstance(values, str) else list(values)
        if len(words) > 1:
            _deprecated(
                namespace,
                f"space-separated lists are deprecated; use {option_string} {','.join(words)}",
            )
        out = []
        for word in words:
            for raw in word.split(","):
                if not raw.strip():
                    continue
                if self.item_choices is not None and raw.strip() not in self.item_choices:
                    parser.error(
                        f"argument {option_string}: invalid choice {raw.strip()!r} "
                        f"(choose from {', '.join(map(str, self.item_choices))})"
                    )
                try:
                    out.append(self.item(raw.strip()))
                except (argparse.ArgumentTypeError, ValueError) as exc:
                    parser.error(f"argument {option_string}: {exc}")
        if not out:
            parser.error(f"argument {option_string}: give at least one value")
        setattr(namespace, self.dest, out)


def _subparsers(p: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    return [
        child
        for a in p._actions
        if isinstance(a, argparse._SubParsersAction)
        for child in dict(a.choices).values()
    ]


class ListHelpFormatter(argparse.HelpFormatter):
    """Shows a :class:`CommaList` option as ``--sizes SIZE,..`` (not argparse's rendering of
    the ``nargs="+"`` it takes for the old space-separated form)."""

    def _format_args(self, action: argparse.Action, default_metavar: str) -> str:
        if isinstance(action, CommaList):
            return str(self._metavar_formatter(action, default_metavar)(1)[0])
        return super()._format_args(action, default_metavar)


def add_verbose_everywhere(p: argparse.ArgumentParser) -> None:
    """Let every subcommand (at any depth) take ``-v``/``--verbose`` after its name too; it
    sets the same ``verbose`` the top level does (left unset where not given). Subcommands
    with the plain help layout get :class:`ListHelpFormatter`."""
    for child in _subparsers(p):
        if child.formatter_class is argparse.HelpFormatter:
            child.formatter_class = ListHelpFormatter
        child.add_argument(
            "-v",
            "--verbose",
            action="store_true",
            default=argparse.SUPPRESS,
            help="log at INFO level (also accepted before the subcommand)",
        )
        add_verbose_everywhere(child)


def walk(p: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every subcommand path under ``p`` (``("bench", "sync")``), for tests and docs."""
    out = []
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, child in dict(a.choices).items():
                out.append((*path, name))
                out += walk(child, (*path, name))
    return out
