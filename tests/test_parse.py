"""Parser: AST shapes and spans, and fuzzing (random and mutated programs never raise anything
but CllError)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hipress.compll import load_source
from hipress.compll.algorithm import algorithms, shipped_path
from hipress.compll.backends.targets import render
from hipress.compll.frontend import ast
from hipress.compll.frontend.check import check_source
from hipress.compll.frontend.parse import parse
from hipress.compll.ir.source import CllError, CllSyntaxError, SourceFile, Span


def _parse(text: str) -> ast.Module:
    return parse(SourceFile("t.cll", text))


def test_declarations_and_spans() -> None:
    m = _parse(
        'algorithm x "doc";\nparam bw: u32 in {1, 2} = 2;\nparam r: f64 in [0.0, 1.0] = 0.5;\n'
        "state res: f32[n];\npayload { q: uint<bw>[n]; }\n"
    )
    a, bw, r, res, pay = m.decls
    assert a == ast.AlgorithmDecl("x", "doc")
    assert isinstance(bw, ast.ParamDecl) and isinstance(bw.constraint, ast.SetConstraint)
    assert [v.value for v in bw.constraint.values] == [1, 2]
    assert isinstance(r, ast.ParamDecl) and isinstance(r.constraint, ast.RangeConstraint)
    assert isinstance(res, ast.StateDecl) and isinstance(res.type, ast.ArrayTypeAnn)
    assert isinstance(pay, ast.PayloadDecl)
    assert isinstance(pay.fields[0].type, ast.PackedTypeAnn)
    assert bw.span == Span(2, 1, 2, 29)


def test_spans_are_not_part_of_equality() -> None:
    a = _parse("algorithm x;")
    b = _parse("\n\n   algorithm   x  ;")
    assert a == b
    assert a.decls[0].span != b.decls[0].span


def test_precedence_and_associativity() -> None:
    m = _parse("algorithm x; const c = 1 + 2 * 3 - 4 << 1 == 6 && true || false;")
    e = m.decls[1].value
    assert isinstance(e, ast.Binary) and e.op == "||"
    land = e.left
    assert isinstance(land, ast.Binary) and land.op == "&&"
    eq = land.left
    assert isinstance(eq, ast.Binary) and eq.op == "=="
    shl = eq.left
    assert isinstance(shl, ast.Binary) and shl.op == "<<"
    sub = shl.left
    assert isinstance(sub, ast.Binary) and sub.op == "-"  # (1 + 2*3) - 4: left-assoc
    add = sub.left
    assert isinstance(add, ast.Binary) and add.op == "+"
    assert isinstance(add.right, ast.Binary) and add.right.op == "*"


def test_lambdas_ternary_blocks() -> None:
    m = _parse(
        "algorithm x; encode(g) { let r = reduce((a, b) => a + b, 0.0, n, i => { let y = g[i];"
        " if (y > 0.0) { return y; } else { return -y; } }); return concat(r > 0.0 ? 1 : 0); }"
    )
    body = m.decls[1].body.stmts
    call = body[0].value
    assert isinstance(call, ast.Call) and call.func == "reduce"
    comb, _init, _len, elem = call.args
    assert isinstance(comb, ast.Lambda) and comb.params == ("a", "b")
    assert isinstance(elem, ast.Lambda) and isinstance(elem.body, ast.Block)
    ret = body[1].value.args[0]
    assert isinstance(ret, ast.Cond)


def test_comments_and_hex() -> None:
    m = _parse("// c\nalgorithm x; /* block\n comment */ const k = 0xff;")
    assert m.decls[1].value.value == 255


def test_leading_zeros_do_not_count_against_pythons_digit_limit() -> None:
    """Python refuses to convert more than 4300 decimal digits; a literal of that many leading
    zeros is still its value (it raised a Lark VisitError), and a long one is still refused."""
    m = _parse(f"algorithm x; const k = {'0' * 5000}17;")
    assert m.decls[1].value.value == 17
    with pytest.raises(CllSyntaxError, match=r"t.cll:1:24: .*\(5022 digits\) does not fit in i64"):
        _parse(f"algorithm x; const k = {'0' * 5000}{'9' * 22};")


def test_syntax_error_position() -> None:
    try:
        _parse("algorithm x;\nconst k = (1 + ;")
    except CllSyntaxError as e:
        assert e.span is not None and (e.span.line, e.span.col) == (2, 16)
        assert "expected" in e.message
    else:  # pragma: no cover
        raise AssertionError("no error")


# ---------------------------------------------------------------- fuzzing

TOKENS = [
    "algorithm", "param", "const", "state", "payload", "fn", "encode", "decode", "let", "var",
    "if", "else", "return", "uint", "true", "false", "in", "map", "reduce", "filter", "topk",
    "sort", "scan", "scatter", "gather", "segreduce", "concat", "extract", "sum", "max", "n", "g",
    "p", "i", "x", "f32", "u8", "i64", "f16", "1", "2.5", "0x1f", "(", ")", "{", "}", "[", "]",
    "<", ">", ";", ",", ":", ".", "=", "=>", "+", "-", "*", "/", "%", "==", "&&", "||", "!", "?",
    "->", '"s"', "<<", ">>", "&", "|", "^", "~",
]  # fmt: skip


def _must_be_clean(text: str) -> None:
    try:
        check_source(SourceFile("f.cll", text))
    except CllError as e:
        assert str(e).startswith("f.cll")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(TOKENS), max_size=60))
def test_fuzz_random_token_streams(toks: list[str]) -> None:
    _must_be_clean(" ".join(toks))


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=200))
def test_fuzz_random_text(text: str) -> None:
    _must_be_clean(text)


SHIPPED = [Path(shipped_path(a)).read_text() for a in algorithms()]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(0, len(SHIPPED) - 1),
    st.lists(
        st.tuples(
            st.sampled_from(["del", "ins", "rep", "dup"]), st.floats(0, 1), st.sampled_from(TOKENS)
        ),
        min_size=1,
        max_size=4,
    ),
)
def test_fuzz_mutated_programs(which: int, edits: list[tuple[str, float, str]]) -> None:
    words = SHIPPED[which].split(" ")
    for kind, where, tok in edits:
        k = int(where * (len(words) - 1))
        if kind == "del":
            del words[k]
        elif kind == "ins":
            words.insert(k, tok)
        elif kind == "rep":
            words[k] = tok
        else:
            words.insert(k, words[k])
    _must_be_clean(" ".join(words))


def test_adversarial_sources_are_refused_at_bounded_cost() -> None:
    """A huge file is refused before parsing; the largest accepted file with a chain nested
    too deep is refused, located, in about a second, never with a RecursionError."""
    import time

    from hipress.compll.frontend.parse import MAX_SOURCE_BYTES

    def source(terms: int) -> SourceFile:
        chain = "+".join(["g[i]"] * terms)
        return SourceFile("t.cll", "algorithm t;\npayload { q: f32[n]; }\nencode(g) { return "
                          f"concat(map(n, i => {chain})); }}\ndecode(p) {{ return p.q; }}\n")  # fmt: skip

    t = time.perf_counter()
    with pytest.raises(CllSyntaxError, match="at most 64 KiB"):
        parse(source(1 << 18))
    assert time.perf_counter() - t < 1.0
    biggest = (MAX_SOURCE_BYTES - 200) // 5
    with pytest.raises(CllSyntaxError, match=r"t.cll:3:\d+: syntax error: nested more than 100"):
        parse(source(biggest))
    # 90 terms, 90 nested calls, ?: and unary minus are fine, through every stage
    for body in ("+".join(["g[i]"] * 90), "abs(" * 90 + "g[i]" + ")" * 90, "-" * 90 + "g[i]",
                 "g[i] > 0.0 ? " * 90 + "1.0" + " : 0.0" * 90):  # fmt: skip
        text = (f"algorithm t;\npayload {{ q: f32[n]; }}\nencode(g) {{ return concat(map(n, "
                f"i => {body})); }}\ndecode(p) {{ return p.q; }}\n")  # fmt: skip
        alg = load_source(SourceFile("t.cll", text), backend="reference")
        render(alg.program, "c")
        render(alg.program, "cuda")
