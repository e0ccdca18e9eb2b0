"""Source files, spans and the diagnostics every user-facing CompLL error carries.

A diagnostic renders as::

    path:line:col: error: message
       3 |     let x = foo(;
         |                 ^
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class SourceFile:
    """The text of one ``.cll`` file and the path it is reported under."""

    path: str
    text: str

    @classmethod
    def read(cls, path: str | Path) -> SourceFile:
        """Read ``path``; raise :class:`CllError` (not OSError) if it cannot be read."""
        try:
            return cls(str(path), Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise CllError(f"cannot read {path}: {exc}") from None

    def line(self, lineno: int) -> str:
        """Line ``lineno`` (1-based) as the parser counts lines: split at ``\n`` only (not at
        ``\v``, ``\f``, ``\x85`` or ``\u2028``, which :meth:`str.splitlines` also splits at)."""
        lines = self.text.split("\n")
        return lines[lineno - 1].rstrip("\r") if 0 < lineno <= len(lines) else ""


@dataclass(frozen=True)
class Span:
    """A 1-based line/column range in a source file (end column exclusive)."""

    line: int
    col: int
    end_line: int
    end_col: int

    def merge(self, other: Span) -> Span:
        start = min((self.line, self.col), (other.line, other.col))
        end = max((self.end_line, self.end_col), (other.end_line, other.end_col))
        return Span(start[0], start[1], end[0], end[1])


NO_SPAN = Span(0, 0, 0, 0)


def span_field() -> Span:
    """A dataclass field for spans: excluded from equality, hashing and repr."""
    return field(default=NO_SPAN, compare=False, hash=False, repr=False)


class CllError(Exception):
    """A user-facing CompLL error. ``str()`` is the full rendered diagnostic.

    Subclasses name the stage: :class:`CllSyntaxError` (parse), :class:`CllTypeError` (check),
    :class:`CllParamError` (bad hyper-parameter values).
    """

    kind = "error"

    def __init__(
        self, message: str, source: SourceFile | None = None, span: Span | None = None
    ) -> None:
        self.message = message
        self.source = source
        self.span = span
        super().__init__(self.render())

    def render(self) -> str:
        if self.source is None or self.span is None or self.span.line == 0:
            where = f"{self.source.path}: " if self.source is not None else ""
            return f"{where}{self.kind}: {self.message}"
        sp = self.span
        head = f"{self.source.path}:{sp.line}:{sp.col}: {self.kind}: {self.message}"
        text = self.source.line(sp.line).rstrip("\n").expandtabs(1)
        width = (sp.end_col - sp.col) if sp.end_line == sp.line else len(text) - sp.col + 1
        width = max(1, width)
        gutter = f"{sp.line:>4} | "
        caret = " " * (len(gutter) - 2) + "| " + " " * (sp.col - 1) + "^" + "~" * (width - 1)
        return f"{head}\n{gutter}{text}\n{caret}"


class CllSyntaxError(CllError):
    kind = "syntax error"


class CllTypeError(CllError):
    kind = "error"


class CllParamError(CllError):
    """A hyper-parameter value is missing, unknown, of the wrong type or out of range."""

    kind = "parameter error"
