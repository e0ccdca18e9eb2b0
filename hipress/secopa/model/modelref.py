"""Model references as the command line writes them: ``path/to/file.py:NAME`` or
``package.module:NAME``, optionally with literal call arguments, ``NAME(vocab=8192)``
(:func:`parse_ref`). Parsing imports nothing; :mod:`hipress.secopa.model.specs` resolves them."""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

__all__ = ["FACTORY_HELP", "ModelRef", "ModelSpecError", "parse_ref"]


class ModelSpecError(ValueError):
    """A model name or ``file.py:NAME`` / ``module:NAME`` reference cannot be resolved."""


FACTORY_HELP = (
    "NAME must be an nn.Module instance, or an nn.Module class or a factory function returning "
    "one, called without arguments or with literal ones written after it, e.g. "
    "--model 'train.py:make_model(vocab=8192, tied=True)' or --model train.py:make_model"
)

# where:NAME or where:NAME(ARGS); the first colon followed by a dotted name ends ``where``, so a
# Windows drive letter stays in the path and ARGS may hold colons (a dict literal)
_REF = re.compile(r"(?P<where>.+?):(?P<attr>[A-Za-z_][\w.]*)(?P<call>\(.*\))?", re.S)


@dataclass(frozen=True)
class ModelRef:
    """A parsed ``where:NAME`` or ``where:NAME(ARGS)`` reference (:func:`parse_ref`)."""

    where: str
    attr: str
    args: tuple[object, ...] = ()
    kwargs: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))
    called: bool = False  # ARGS were written, even ``()``

    @property
    def is_file(self) -> bool:
        """Whether ``where`` names a Python file rather than a module to import."""
        w = self.where
        return w.endswith(".py") or "/" in w or "\\" in w or w.startswith(".")


def parse_ref(ref: str) -> ModelRef:
    """``path/to/file.py:NAME``, ``package.module:NAME``, each optionally followed by call
    arguments that are Python literals (``NAME(8192, tied=True, dims=[64, 64])``) -> a
    :class:`ModelRef`. Imports nothing. Raises :class:`ModelSpecError` saying what is wrong."""
    m = _REF.fullmatch(ref.strip())
    if m is None:
        raise ModelSpecError(
            f"{ref!r}: expected module:attr, i.e. path/to/file.py:NAME or package.module:NAME, with "
            f"literal arguments, NAME(k=v, ...) ({FACTORY_HELP})"
        )
    if not m["call"]:
        return ModelRef(m["where"], m["attr"])
    try:
        node = ast.parse("f" + m["call"], mode="eval").body
    except SyntaxError as exc:
        raise ModelSpecError(
            f"{ref!r}: the arguments {m['call']} are not a Python call's ({exc.msg})"
        ) from None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ModelSpecError(f"{ref!r}: write the arguments as one call, NAME(k=v, ...)")
    args = tuple(_literal(ref, a) for a in node.args)
    kwargs: dict[str, object] = {}
    for kw in node.keywords:
        if kw.arg is None:
            raise ModelSpecError(f"{ref!r}: write each keyword argument out; ** is not taken")
        if kw.arg in kwargs:
            raise ModelSpecError(f"{ref!r}: keyword argument {kw.arg!r} given twice")
        kwargs[kw.arg] = _literal(ref, kw.value)
    return ModelRef(m["where"], m["attr"], args, MappingProxyType(kwargs), called=True)


def _literal(ref: str, node: ast.expr) -> object:
    text = ast.unparse(node)
    if isinstance(node, ast.Starred):
        raise ModelSpecError(f"{ref!r}: write each argument out; {text} is not taken")
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise ModelSpecError(
            f"{ref!r}: argument {text!r} is not a literal (numbers, strings, True, False, "
            "None, and tuples, lists and dicts of them); compute it in a factory function"
        ) from None
