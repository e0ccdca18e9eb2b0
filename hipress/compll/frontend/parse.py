"""Stage 1: ``.cll`` text -> :class:`hipress.compll.frontend.ast.Module`.

The grammar (``cll.lark``) is data; the transformer below only builds nodes and spans. Lark's
exceptions never escape: they become :class:`CllSyntaxError` with the position and what was
expected there.

Bounded cost: a source of more than :data:`MAX_SOURCE_BYTES` is refused before it is parsed, and a
parse tree nested more than :data:`MAX_DEPTH` levels deep (a sum of hundreds of terms, hundreds
of nested calls or ``?:``) is refused where it gets too deep, before any stage recurses into it.
Literals must fit their types: an integer at most ``2**63 - 1``, a float finite.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Any

import lark
from lark import Token, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from hipress.compll.frontend import ast
from hipress.compll.ir.source import CllSyntaxError, SourceFile, Span

MAX_SOURCE_BYTES = 64 * 1024  # the largest shipped algorithm has 4 KiB
MAX_DEPTH = 100  # levels of the parse tree: expressions, blocks, statements
_I64_MAX = (1 << 63) - 1


class _LiteralError(Exception):
    """A literal that fits no type (raised inside the transformer, reported by :func:`parse`)."""

    def __init__(self, msg: str, span: Span) -> None:
        super().__init__(msg)
        self.msg, self.span = msg, span


@lru_cache(maxsize=1)
def _parser() -> lark.Lark:
    grammar = resources.files("hipress.compll.frontend").joinpath("cll.lark").read_text()
    return lark.Lark(grammar, parser="lalr", propagate_positions=True, maybe_placeholders=True)


def _span(meta: Any) -> Span:
    if getattr(meta, "empty", True):
        return Span(0, 0, 0, 0)
    return Span(meta.line, meta.column, meta.end_line, meta.end_column)


def _tspan(tok: Token) -> Span:
    return Span(tok.line, tok.column, tok.end_line, tok.end_column)


@v_args(meta=True)
class _Build(Transformer):
    """Parse tree -> AST. Builds nodes and spans only; no checking."""

    def start(self, meta, items):
        return ast.Module(tuple(items), _span(meta))

    # declarations
    def algorithm_decl(self, meta, c):
        doc = str(c[1])[1:-1] if c[1] is not None else ""
        return ast.AlgorithmDecl(str(c[0]), doc, _span(meta))

    def param_decl(self, meta, c):
        return ast.ParamDecl(str(c[0]), c[1], c[2], c[3], _span(meta))

    def range_constraint(self, meta, c):
        return ast.RangeConstraint(c[0], c[1], _span(meta))

    def set_constraint(self, meta, c):
        return ast.SetConstraint(tuple(c), _span(meta))

    def const_decl(self, meta, c):
        return ast.ConstDecl(str(c[0]), c[1], c[2], _span(meta))

    def state_decl(self, meta, c):
        return ast.StateDecl(str(c[0]), c[1], _span(meta))

    def payload_decl(self, meta, c):
        name = str(c[0]) if c[0] is not None else None
        return ast.PayloadDecl(tuple(c[1:]), _span(meta), name)

    def field_decl(self, meta, c):
        return ast.FieldDecl(str(c[0]), c[1], _span(meta))

    def fn_decl(self, meta, c):
        name, *rest = c
        params = tuple(p for p in rest[:-2] if p is not None)
        return ast.FnDecl(str(name), params, rest[-2], rest[-1], _span(meta))

    def fn_param(self, meta, c):
        return ast.FnParam(str(c[0]), c[1], _span(meta))

    def encode_decl(self, meta, c):
        names = [str(x) for x in c[:-2]]
        target = str(c[-2]) if c[-2] is not None else None
        return ast.EncodeDecl(names[0], c[-1], _span(meta), tuple(names[1:]), target)

    def decode_decl(self, meta, c):
        names = [str(x) for x in c[:-1]]
        return ast.DecodeDecl(names[0], c[-1], _span(meta), tuple(names[1:]))

    # types
    def scalar_type(self, meta, c):
        return ast.ScalarTypeAnn(str(c[0]), _span(meta))

    def array_type(self, meta, c):
        return ast.ArrayTypeAnn(str(c[0]), c[1], _span(meta))

    def packed_type(self, meta, c):
        return ast.PackedTypeAnn(c[0], c[1], _span(meta))

    # statements
    def block(self, meta, c):
        return ast.Block(tuple(c), _span(meta))

    def let_stmt(self, meta, c):
        return ast.Let(str(c[0]), c[1], c[2], _span(meta))

    def let_tuple(self, meta, c):
        return ast.LetTuple(tuple(str(x) for x in c[:-1]), c[-1], _span(meta))

    def var_stmt(self, meta, c):
        return ast.VarDecl(str(c[0]), c[1], c[2], _span(meta))

    def assign_stmt(self, meta, c):
        return ast.Assign(str(c[0]), str(c[1]), c[2], _span(meta))

    def if_stmt(self, meta, c):
        return ast.If(c[0], c[1], c[2], _span(meta))

    def else_if(self, meta, c):
        return c[0]

    def for_stmt(self, meta, c):
        start, stop = (c[1], c[2]) if c[2] is not None else (None, c[1])
        return ast.For(str(c[0]), start, stop, c[3], _span(meta))

    def block_stmt(self, meta, c):
        return ast.BlockSection(c[0], c[1], _span(meta))

    def return_stmt(self, meta, c):
        return ast.Return(c[0], _span(meta))

    # expressions
    def lambda_(self, meta, c):
        return ast.Lambda(tuple(str(x) for x in c[:-1]), c[-1], _span(meta))

    def cond(self, meta, c):
        return ast.Cond(c[0], c[1], c[2], _span(meta))

    def binop(self, meta, c):
        return ast.Binary(str(c[1]), c[0], c[2], _span(meta))

    def unary(self, meta, c):
        return ast.Unary(str(c[0]), c[1], _span(meta))

    def index(self, meta, c):
        return ast.Index(c[0], c[1], _span(meta))

    def field(self, meta, c):
        return ast.Field(c[0], str(c[1]), _span(meta))

    def call(self, meta, c):
        name, *args = c
        args = tuple(a for a in args if a is not None)
        return ast.Call(str(name), args, _span(meta), _tspan(name))

    def number(self, meta, c):
        text = str(c[0])
        is_float = not text.lower().startswith("0x") and any(ch in text for ch in ".eE")
        span = _span(meta)
        if is_float:
            if float(text) in (float("inf"), float("-inf")):
                raise _LiteralError(
                    f"float literal {text} is out of range (finite floats stay below 1.8e308)",
                    span,
                )
        else:
            digits = text[2:] if text.lower().startswith("0x") else text
            big = len(digits.lstrip("0")) > 19 or ast.Number(text, False).value > _I64_MAX
            if big:
                shown = (
                    text if len(text) <= 30 else f"{text[:12]}...{text[-6:]} ({len(text)} digits)"
                )
                raise _LiteralError(
                    f"integer literal {shown} does not fit in i64 (at most {_I64_MAX})", span
                )
        return ast.Number(text, is_float, span)

    def true(self, meta, c):
        return ast.Bool(True, _span(meta))

    def false(self, meta, c):
        return ast.Bool(False, _span(meta))

    def name(self, meta, c):
        return ast.Name(str(c[0]), _span(meta))

    def _collapse(self, meta, c):  # operator rules: keep the token text
        return str(c[0])

    or_op = and_op = bor_op = bxor_op = band_op = eq_op = cmp_op = _collapse
    shift_op = add_op = mul_op = unary_op = assign_op = _collapse


# "lambda" is a Python keyword; Lark looks the rule up by name.
setattr(_Build, "lambda", _Build.lambda_)

_READABLE = {
    "NAME": "a name",
    "NUMBER": "a number",
    "STRING": "a string",
    "$END": "end of file",
}


# Tokens that continue an expression. After a complete expression they are all acceptable, and
# listing them would bury the one a user most likely forgot (`;`, `)`, `,`): they are summarised
# as "an operator" when there are many.
_OPERATORS = frozenset(
    {"||", "&&", "|", "^", "&", "==", "!=", "<", "<=", ">", ">=", "<<", ">>"}
    | {"+", "-", "*", "/", "%", "?", ".", "["}
)


def _describe(parser: lark.Lark, names: set[str]) -> str:
    out = []
    for name in sorted(names):
        if name in _READABLE:
            out.append(_READABLE[name])
            continue
        try:
            pat = parser.get_terminal(name).pattern
        except KeyError:
            out.append(name.lower())
            continue
        if pat.type == "str":
            out.append(f"'{pat.value}'")
        else:
            out.append(name.lower())
    out = sorted(set(out))
    ops = [t for t in out if t[1:-1] in _OPERATORS and t.startswith("'")]
    if len(out) > 10 and len(ops) > 2:
        out = [*(t for t in out if t not in ops), "an operator"]
    if len(out) > 10:
        out = [*out[:10], "..."]
    return ", ".join(out)


def parse(source: SourceFile) -> ast.Module:
    """Parse ``source`` into an AST.

    Returns the :class:`ast.Module`; raises :class:`CllSyntaxError` (with span and the expected
    tokens) on any syntax error. No Lark exception escapes.
    """
    size = len(source.text.encode("utf-8", "surrogatepass"))
    if size > MAX_SOURCE_BYTES:
        raise CllSyntaxError(
            f"the file is {size // 1024} KiB; a .cll file may have at most "
            f"{MAX_SOURCE_BYTES // 1024} KiB",
            source,
            None,
        )
    parser = _parser()
    try:
        tree = parser.parse(source.text)
    except UnexpectedInput as exc:
        raise _syntax_error(parser, source, exc) from None
    except lark.exceptions.LarkError as exc:  # pragma: no cover - defensive
        raise CllSyntaxError(f"cannot parse: {exc}", source, None) from None
    deep = _too_deep(tree)
    if deep is not None:
        raise CllSyntaxError(
            f"nested more than {MAX_DEPTH} levels deep; split the expression with `let`s or "
            "into functions",
            source,
            _span(deep.meta),
        )
    try:
        return _Build().transform(tree)
    except lark.exceptions.VisitError as exc:
        err = exc.orig_exc
        if isinstance(err, _LiteralError):
            raise CllSyntaxError(err.msg, source, err.span) from None
        raise  # pragma: no cover - a bug in the transformer


def _too_deep(tree: lark.Tree) -> lark.Tree | None:
    """The first subtree deeper than :data:`MAX_DEPTH` levels, if any (no recursion)."""
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            return node
        stack.extend((c, depth + 1) for c in node.children if isinstance(c, lark.Tree))
    return None


def _lines(text: str) -> list[str]:
    """Lines as the parser counts them (at ``\n`` only), without the empty one after a final
    newline."""
    lines = text.split("\n")
    if len(lines) > 1 and lines[-1] == "":
        lines.pop()
    return lines


def _syntax_error(parser: lark.Lark, source: SourceFile, exc: UnexpectedInput) -> CllSyntaxError:
    line = getattr(exc, "line", 0) or 0
    col = getattr(exc, "column", 0) or 0
    if isinstance(exc, UnexpectedToken):
        tok = exc.token
        if tok.type == "$END":
            lines = _lines(source.text)
            line, col = len(lines), len(lines[-1]) + 1
            got, width = "end of file", 1
        else:
            got, width = f"'{tok}'", max(1, len(str(tok)))
        expected = _describe(parser, set(exc.accepts or exc.expected))
        msg = f"unexpected {got}; expected {expected}"
        pos = getattr(tok, "start_pos", None)
        if str(tok) == "/" and pos is not None and source.text.startswith("/*", pos):
            msg, width = "unterminated comment: this `/*` has no `*/`", 2
    elif isinstance(exc, UnexpectedCharacters):
        ch = source.text[exc.pos_in_stream] if exc.pos_in_stream < len(source.text) else "?"
        width = 1
        if ch == '"':
            msg = "unterminated string"
        else:
            msg = f"unexpected character {ch!r}"
    elif isinstance(exc, UnexpectedEOF):
        lines = _lines(source.text)
        line, col, width = len(lines), len(lines[-1]) + 1, 1
        msg = f"unexpected end of file; expected {_describe(parser, set(exc.expected))}"
    else:  # pragma: no cover
        width = 1
        msg = str(exc)
    if line <= 0:
        line, col = 1, 1
    return CllSyntaxError(msg, source, Span(line, col, line, col + width))
