"""Grammar-aware generators of CompLL sources for the fuzz tests (tests/test_fuzz.py).

- :func:`mutants`: token-level mutations of a valid source (delete, duplicate, swap, replace a
  name, literal or operator with another the grammar knows, truncate, deep nesting, huge
  literals, odd whitespace and line separators, stray characters).
- :func:`programs`: well-typed programs built from the language's constructs (params, consts,
  scalar and array state with error feedback, fns, every parallel operator, block lambdas with
  ``var`` and ``if``, casts, ``?:``, packed and storage-only payload fields, ``extract``, a
  sparse scatter decode). Every one must be accepted, and every backend must compute it bit for
  bit like the reference interpreter, so the generator keeps to the part of the language that
  docs/reference/compll-api.md ("Equal on every backend") promises is exact: float sums
  only of values whose f64 sum is exact in any order (the gradient in the test's value regimes,
  its power-of-two multiples, f32/f64 of 32-bit integers), no ``sqrt`` and no float ``%``.
  Float scatters may repeat indices: their adds run in a defined order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from hypothesis import strategies as st

# ---------------------------------------------------------------- tokens and mutations

_TOKEN = re.compile(
    r"""(?P<ws>\s+)|(?P<comment>//[^\n]*|/\*.*?\*/)|(?P<string>"[^"\n]*")
    |(?P<number>0[xX][0-9a-fA-F]+|(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)
    |(?P<name>[A-Za-z_][A-Za-z0-9_]*)
    |(?P<op>=>|->|<<|>>|<=|>=|==|!=|&&|\|\||\+=|-=|\*=|/=|[-+*/%<>=!~&|^?:;,.(){}\[\]])
    |(?P<other>.)""",
    re.S | re.X,
)

KEYWORDS = ("algorithm", "param", "const", "state", "payload", "fn", "encode", "decode", "let",
            "var", "if", "else", "return", "uint", "true", "false", "in", "for", "range")  # fmt: skip
BUILTIN_NAMES = ("map", "reduce", "segreduce", "filter", "topk", "sort", "scan", "scatter",
                 "scatter_set", "gather", "concat", "extract", "sum", "min", "max", "absmax",
                 "any", "all", "count", "abs", "sign", "floor", "ceil", "round", "trunc", "sqrt", "isnan",
                 "isinf", "isfinite", "clamp", "uniform", "urand", "randint", "size", "n", "inf",
                 "nan", "as_u32", "as_i32", "as_f32", "as_i64", "as_f64", "exponent",
                 "ldexp", "hash")  # fmt: skip
TYPE_NAMES = ("bool", "u8", "u16", "u32", "i8", "i16", "i32", "i64", "f16", "bf16", "f8e4m3", "f8e5m2", "f32", "f64")
OPERATORS = ("=>", "->", "<<", ">>", "<=", ">=", "==", "!=", "&&", "||", "+=", "-=", "*=", "/=",
             "+", "-", "*", "/", "%", "<", ">", "=", "!", "~", "&", "|", "^", "?", ":", ";", ",",
             ".", "(", ")", "{", "}", "[", "]")  # fmt: skip
BINOPS = ("+", "-", "*", "/", "%", "<<", ">>", "&", "|", "^", "&&", "||", "==", "!=", "<", "<=",
          ">", ">=")  # fmt: skip
NUMBERS = ("0", "1", "2", "7", "8", "64", "255", "256", "65535", "65536", "2147483647",
           "2147483648", "4294967295", "4294967296", "9223372036854775807",
           "9223372036854775808", "0x0", "0xff", "0xFFFFFFFF", "0x7fffffffffffffff",
           "0x8000000000000000", "0.0", "0.5", "1.0", "1e-3", "3.4028234663852886e38",
           "3.5e38", "1e308", "1.8e308", "1e-320", "1e-46", ".5", "5.", "1e+2", "00", "007")  # fmt: skip
# whitespace the parser may not treat as a line break, and characters it must refuse cleanly
ODD_SPACE = ("\t", "\r", "\r\n", "\v", "\f", "\x85", "\u2028", "\u2029", "\u00a0", "\ufeff",
             "\u3000", "\u200b", "\x00", "\n\n\n")  # fmt: skip
STRAY = ("é", "λ", "→", "\U0001f600", "\ud800", "\x1b", "\\", "@", "#", "$", "`", "'", '"',
         "/*", "*/", "//", "\x7f", "０")  # fmt: skip


def tokens(text: str) -> list[tuple[str, str]]:
    """``text`` as (kind, text) pairs; joining the texts gives ``text`` back."""
    return [(m.lastgroup or "other", m.group()) for m in _TOKEN.finditer(text)]


def _huge_literal(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["int", "zeros", "hex", "float", "exp", "frac"]))
    k = draw(st.sampled_from([20, 40, 320, 4400, 20000]))
    if kind == "int":
        return "9" * k
    if kind == "zeros":  # leading zeros: a small value written with many digits
        return "0" * k + "1"
    if kind == "hex":
        return "0x" + "f" * k
    if kind == "float":
        return "1" * k + ".5"
    if kind == "exp":
        return "1e" + "9" * min(k, 400)
    return "0." + "0" * k + "1"


def _nesting(draw: st.DrawFn, tok: str) -> str:
    d = draw(st.sampled_from([2, 50, 99, 101, 300, 3000]))
    kind = draw(st.sampled_from(["paren", "neg", "not", "call", "cond", "block", "index"]))
    if kind == "paren":
        return "(" * d + tok + ")" * d
    if kind == "neg":
        return "-" * d + tok
    if kind == "not":
        return "!" * d + tok
    if kind == "call":
        return "abs(" * d + tok + ")" * d
    if kind == "cond":
        return "true ? " * d + tok + " : 0" * d
    if kind == "block":
        return "{" * d + tok + "}" * d
    return tok + "[0]" * d


@st.composite
def mutants(draw: st.DrawFn, text: str) -> str:
    """``text`` with one to four token-level mutations."""
    toks = [t for _, t in tokens(text)]
    kinds = [k for k, _ in tokens(text)]
    names = sorted({t for k, t in zip(kinds, toks, strict=True) if k == "name"})
    for _ in range(draw(st.sampled_from([1, 1, 1, 2, 3, 4]))):
        sig = [j for j, k in enumerate(kinds) if k not in ("ws", "comment")]
        if not sig:
            break
        j = sig[draw(st.integers(0, len(sig) - 1))]
        # (replacements in kind keep the syntax more often, so the checker sees more of them)
        what = draw(st.sampled_from(["delete", "duplicate", "swap", "name", "name", "name",
                                     "number", "number", "operator", "binop", "binop", "truncate",
                                     "nest", "huge", "space", "stray", "keyword"]))  # fmt: skip
        new: list[str]
        if what == "delete":
            new = []
        elif what == "duplicate":
            new = [toks[j], " ", toks[j]]
        elif what == "swap":
            k = sig[draw(st.integers(0, len(sig) - 1))]
            toks[j], toks[k] = toks[k], toks[j]
            kinds[j], kinds[k] = kinds[k], kinds[j]
            continue
        elif what == "name":
            new = [draw(st.sampled_from(names + list(BUILTIN_NAMES) + list(TYPE_NAMES)
                                        + ["_", "x" * 70, "g2", "p"]))]  # fmt: skip
        elif what == "number":
            new = [draw(st.sampled_from(NUMBERS))]
        elif what == "operator":
            new = [draw(st.sampled_from(OPERATORS))]
        elif what == "binop":
            ops = [k for k in sig if toks[k] in BINOPS]
            if not ops:
                continue
            j = ops[draw(st.integers(0, len(ops) - 1))]
            new = [draw(st.sampled_from(BINOPS))]
        elif what == "keyword":
            new = [draw(st.sampled_from(KEYWORDS))]
        elif what == "truncate":
            cut = draw(st.integers(0, len(toks[j])))
            toks, kinds = [*toks[:j], toks[j][:cut]], kinds[: j + 1]
            continue
        elif what == "nest":
            new = [_nesting(draw, toks[j])]
        elif what == "huge":
            new = [_huge_literal(draw)]
        elif what == "space":
            new = [toks[j], draw(st.sampled_from(ODD_SPACE))]
        else:
            new = [toks[j][: draw(st.integers(0, len(toks[j])))], draw(st.sampled_from(STRAY))]
        toks[j : j + 1] = new
        kinds[j : j + 1] = ["other"] * len(new)
        if what in ("name", "number", "operator", "binop", "keyword"):
            kinds[j] = {"name": "name", "keyword": "name", "number": "number"}.get(what, "op")
    return "".join(toks)


# ---------------------------------------------------------------- well-typed programs

NUM = ("f32", "f64", "i32", "i64", "u8", "u32")
FLOATS = ("f32", "f64")
RANGES = {"i32": (-(2**31), 2**31 - 1), "i64": (-(2**63), 2**63 - 1), "u8": (0, 255),
          "u32": (0, 2**32 - 1), "i16": (-(2**15), 2**15 - 1)}  # fmt: skip
FLOAT_LITS = ("0.0", "1.0", "0.5", "2.0", "-1.5", "3.0", "0.25", "1024.0", "0.001", "-0.0")
LENGTHS = ("n", "n", "n", "min(n, 5)", "(n + 3) / 4", "max(1, n / 3)", "n + 2", "1", "0",
           "max(0, n - 1)", "2 * n", "(n + 63) / 64")  # fmt: skip


@dataclass(frozen=True)
class Arr:
    """An array in scope, as an expression reads it."""

    name: str  # as written (`c`, `p.q`)
    dtype: str  # element type as read (a packed array reads u8)
    length: str  # length expression, as written
    bits: int | None = None  # packed width
    exact: bool = False  # its f64 sum is exact in any order (see module doc)
    count: str | None = None  # distinct int indices below this count (filter, topk)


@dataclass(frozen=True)
class Fn:
    name: str
    params: tuple[str, ...]  # types
    ret: str


@dataclass
class Scope:
    scalars: list[tuple[str, str]] = field(default_factory=list)  # (expression, type)
    arrays: list[Arr] = field(default_factory=list)
    index: str | None = None  # the lambda's index, inside a lambda
    encode: bool = False  # random numbers allowed
    fns: list[Fn] = field(default_factory=list)

    def inner(self, index: str | None = None) -> Scope:
        return Scope(list(self.scalars), list(self.arrays), index or self.index, self.encode,
                     self.fns)  # fmt: skip


def _lit(t: str, value: object) -> str:
    """A literal of type ``t`` that is not an adapting literal (``T(v)``, or ``-`` inside)."""
    if t == "bool":
        return "true" if value else "false"
    if t in FLOATS:
        return f"{t}({value})"
    v = int(value)  # type: ignore[call-overload]
    if v == -(2**63):
        return "i64(-9223372036854775807 - 1)"
    return f"{t}({v})"


class _Gen:
    """One program's generator: draws choices, names fresh values, writes the text."""

    def __init__(self, draw: st.DrawFn) -> None:
        self.draw = draw
        self.k = 0
        self.positive: list[str] = []  # consts that are at least 1 (segment lengths)
        self.static: list[str] = ["true", "false"]  # bools known when compiling (parameters)

    def fresh(self, base: str) -> str:
        self.k += 1
        return f"{base}{self.k}"

    def pick(self, seq):  # type: ignore[no-untyped-def]
        return self.draw(st.sampled_from(list(seq)))

    def chance(self, p: float) -> bool:
        return self.draw(st.integers(0, 999)) < p * 1000

    # -- expressions

    def lit(self, t: str) -> str:
        if t == "bool":
            return self.pick(["true", "false"])
        if t in FLOATS:
            v = self.pick(FLOAT_LITS)
            return v if t == "f32" and self.chance(0.5) else _lit(t, v)
        lo, hi = RANGES[t]
        return _lit(t, self.pick([0, 1, 2, 7, 100, lo, hi, lo + 1, hi - 1, -1 if lo else 3]))

    def counter(self, sc: Scope) -> str:
        return sc.index if sc.index and self.chance(0.8) else self.pick(["0", "7", "n"])

    def index(self, sc: Scope, arr: Arr) -> str:
        i = sc.index
        if i is None:
            return self.pick(["0", f"({arr.length}) - 1", "n / 2", "3"])
        ints = [a for a in sc.arrays if a.dtype in ("i32", "i64", "u8") and a is not arr]
        opts = [i, i, f"({i} + 1)", f"({i} - 1)", f"({i} / 2)", f"({i} * 2)",
                f"(({i} + 3) % ({arr.length}))", f"(({arr.length}) - 1 - {i})"]  # fmt: skip
        if ints and self.chance(0.15):
            src = self.pick(ints)
            return f"i64({src.name}[{i}])"
        hosts = [s for s, d in sc.scalars if d == "i64" and s != i]
        if hosts and self.chance(0.2):  # rotated and segment reads by a scalar of the loop
            h = self.pick(hosts)
            return self.pick([f"(({i} + {h}) % ({arr.length}))", f"({i} / {h})",
                              f"(({h} + {i}) % ({arr.length} + 1))"])  # fmt: skip
        return self.pick(opts)

    def leaf(self, t: str, sc: Scope) -> str:
        same = [s for s, d in sc.scalars if d == t]
        other = [s for s, d in sc.scalars if d != t and d not in ("f16", "bf16", "f8e4m3", "f8e5m2")]
        opts = ["lit"] + ["var"] * (3 if same else 0) + ["cast"] * bool(other)
        opts += ["load"] * (3 if sc.arrays else 0) + ["index"] * (2 if sc.index else 0)
        kind = self.pick(opts)
        if kind == "lit":
            return self.lit(t)
        if kind == "var":
            return self.pick(same)
        if kind == "cast":
            return f"{t}({self.pick(other)})"
        if kind == "index":
            if t == "bool":
                return f"({sc.index} % 2 == 0)"
            return sc.index if t == "i64" else f"{t}({sc.index})"  # type: ignore[return-value]
        arr = self.pick(sc.arrays)
        name = arr.name
        twins = [b for b in sc.arrays if b is not arr
                 and (b.dtype, b.length, b.bits) == (arr.dtype, arr.length, arr.bits)]  # fmt: skip
        if twins and self.chance(0.1):  # one of two arrays, chosen by a parameter
            name = f"({self.pick(self.static)} ? {name} : {self.pick(twins).name})"
        text = f"{name}[{self.index(sc, arr)}]"
        return text if arr.dtype == t else f"{t}({text})"

    def expr(self, t: str, sc: Scope, depth: int) -> str:
        if depth <= 0 or self.chance(0.25):
            return self.leaf(t, sc)
        d = depth - 1
        if t == "bool":
            return self.boolean(sc, d)
        kinds = ["bin", "bin", "binlit", "neg", "math", "minmax", "cond", "cast"]
        fns = [f for f in sc.fns if f.ret == t]
        kinds += ["fn"] * bool(fns)
        if t not in FLOATS:
            kinds += ["shift", "bnot", "hash"]
        if sc.encode and t in ("f32", "f64", "u32", "i64", "i32"):
            kinds.append("random")
        if t == "i64" and sc.arrays:
            kinds.append("size")
        kind = self.pick(kinds)
        if kind == "bin":
            ops = ["+", "-", "*", "/"] + (["%", "&", "|", "^"] if t not in FLOATS else [])
            return f"({self.expr(t, sc, d)} {self.pick(ops)} {self.expr(t, sc, d)})"
        if kind == "binlit":
            if t in FLOATS:
                return f"({self.expr(t, sc, d)} {self.pick('+-*/')} {self.pick(['2', '0.5', '3'])})"
            lo, hi = RANGES[t]
            v = self.pick([0, 1, 3, 8, hi] + ([-1, lo] if lo else []))
            op = self.pick(["+", "-", "*", "/", "%", "&", "|", "^", "<<", ">>"])
            text = "(-9223372036854775807 - 1)" if v == -(2**63) else f"({v})" if v < 0 else str(v)
            return f"({self.expr(t, sc, d)} {op} {text})"
        if kind == "neg":
            return f"(-{self.expr(t, sc, d)})"
        if kind == "bnot":
            return f"(~{self.expr(t, sc, d)})"
        if kind == "shift":
            other = self.pick(("i32", "i64", "u8", "u32"))
            return f"({self.expr(t, sc, d)} {self.pick(['<<', '>>'])} {self.expr(other, sc, d)})"
        if kind == "math":
            fs = ["abs", "sign"] + (["floor", "ceil", "round", "trunc"] if t in FLOATS else [])
            return f"{self.pick(fs)}({self.expr(t, sc, d)})"
        if kind == "minmax":
            f = self.pick(["min", "max", "clamp"])
            args = [self.expr(t, sc, d) for _ in range(3 if f == "clamp" else 2)]
            return f"{f}({', '.join(args)})"
        if kind == "cond":
            return f"({self.boolean(sc, d)} ? {self.expr(t, sc, d)} : {self.expr(t, sc, d)})"
        if kind == "cast":
            return f"{t}({self.expr(self.pick([*NUM, 'bool']), sc, d)})"
        if kind == "fn":
            f = self.pick(fns)
            return f"{f.name}({', '.join(self.expr(p, sc, d) for p in f.params)})"
        if kind == "size":
            return f"{self.pick(sc.arrays).name}.size"
        if kind == "hash":  # (the same u32 on every backend, in encode and decode)
            a, b = (self.expr(self.pick(("i32", "i64", "u8", "u32")), sc, d) for _ in "ab")
            return f"hash({a}, {b})" if t == "u32" else f"{t}(hash({a}, {b}))"
        # random numbers
        ctr = self.counter(sc)
        s = f", {self.pick([1, 2, 65535])}" if self.chance(0.4) else ""
        if t in FLOATS:
            u = f"uniform({ctr}{s})"
            return u if t == "f32" else f"f64({u})"
        if t == "i64" and self.chance(0.7):
            return f"randint({ctr}, {self.pick(['10', 'n', '1', '2147483647'])}{s})"
        u = f"urand({ctr}{s})"
        return u if t == "u32" else f"{t}({u})"

    def boolean(self, sc: Scope, d: int) -> str:
        kind = self.pick(["cmp", "cmp", "logic", "not", "isx", "cast", "eq"])
        if kind == "cmp":
            t = self.pick(NUM)
            op = self.pick(["<", "<=", ">", ">=", "==", "!="])
            return f"({self.expr(t, sc, d)} {op} {self.expr(t, sc, d)})"
        if kind == "logic":
            op = self.pick(["&&", "||", "&", "|", "^"])
            return f"({self.expr('bool', sc, d)} {op} {self.expr('bool', sc, d)})"
        if kind == "not":
            return f"(!{self.expr('bool', sc, d)})"
        if kind == "isx":
            return f"{self.pick(['isnan', 'isinf', 'isfinite'])}({self.expr(self.pick(FLOATS), sc, d)})"
        if kind == "cast":
            return f"bool({self.expr(self.pick(NUM), sc, d)})"
        return f"({self.expr('bool', sc, d)} {self.pick(['==', '!='])} {self.expr('bool', sc, d)})"

    def body(self, t: str, sc: Scope, depth: int = 2) -> str:
        """A lambda or fn body: an expression, or a block with `let`, `var` and `if`."""
        if self.chance(0.6):
            return self.expr(t, sc, depth)
        inner = sc.inner()
        lines = []
        for _ in range(self.draw(st.integers(0, 2))):
            lt = self.pick([*NUM, "bool"])
            name = self.fresh("l")
            lines.append(f"let {name}: {lt} = {self.expr(lt, inner, depth)};")
            inner.scalars.append((name, lt))
        v = self.fresh("v")
        lines.append(f"var {v}: {t} = {self.expr(t, inner, depth)};")
        if self.chance(0.3):  # a bounded loop around the update, its counter in scope
            k, lo = self.fresh("k"), self.draw(st.integers(0, 2))
            hi = lo + self.draw(st.integers(0, 3))
            body_sc = inner.inner()
            body_sc.scalars.append((k, "i64"))
            step = self.if_stmt(v, t, body_sc, depth)
            lines.append(f"for {k} in range({lo}, {hi}) {{ {step} }}")
        else:
            lines.append(self.if_stmt(v, t, inner, depth))
        inner.scalars.append((v, t))
        return "{ " + " ".join(lines) + f" return {self.expr(t, inner, depth)}; }}"

    def if_stmt(self, v: str, t: str, sc: Scope, depth: int) -> str:
        op = "=" if t == "bool" else self.pick(["=", "+=", "-=", "*=", "/="])
        then = f"{v} {op} {self.expr(t, sc, depth)};"
        other = self.pick(["", f"{v} = {self.expr(t, sc, depth)};",
                           f"if ({self.boolean(sc, depth)}) {{ {v} = {self.lit(t)}; }}"])  # fmt: skip
        tail = "" if not other else (f" else {other}" if other.startswith("if") else
                                     f" else {{ {other} }}")  # fmt: skip
        return f"if ({self.boolean(sc, depth)}) {{ {then} }}{tail}"

    def lam(self, t: str, sc: Scope) -> str:
        i = self.fresh("i")
        return f"{i} => {self.body(t, sc.inner(i), self.draw(st.integers(1, 3)))}"

    # -- sources for the parallel operators

    def source(self, t: str, sc: Scope, exact: bool = False) -> tuple[str, str]:
        """(`array` or `len, i => value`, its length) of element type ``t``; ``exact``: a
        float source whose f64 sum is exact in any order."""
        exact = exact and t in FLOATS
        arrs = [a for a in sc.arrays if a.dtype == t and (a.exact or not exact)]
        if arrs and self.chance(0.4):
            a = self.pick(arrs)
            return a.name, a.length
        length, lam = self.exact_lam(t, sc) if exact else (self.length(sc), self.lam(t, sc))
        return f"{length}, {lam}", length

    def exact_lam(self, t: str, sc: Scope) -> tuple[str, str]:
        """(length, lambda) of float values whose f64 sum is exact in any order: elements of
        exact arrays (or zero) times a power of two, or 32-bit integers."""
        length = self.length(sc)
        i = self.fresh("i")
        inner = sc.inner(i)
        grads = [a for a in sc.arrays if a.exact and a.dtype == "f32"]
        form = self.pick(["scaled", "select", "int"] if grads else ["int"])
        if form == "int":
            return length, f"{i} => {t}({self.expr('i32', inner, 2)})"
        a = self.pick(grads)
        x = f"{a.name}[{self.index(inner, a)}]"
        if form == "scaled":
            v = f"{x} * {self.pick(['0.5', '2.0', '0.25', '-1.0', '4.0'])}"
        else:
            v = f"({self.boolean(inner, 1)} ? {x} : 0.0)"
        return length, f"{i} => {v if t == 'f32' else f'f64({v})'}"

    def length(self, sc: Scope) -> str:
        consts = [s for s, d in sc.scalars if d == "i64" and s.startswith("k")]
        return self.pick(list(LENGTHS) + consts)


@dataclass
class _Enc:
    """What encode has computed so far: values a payload field can send."""

    lines: list[str] = field(default_factory=list)
    values: list[tuple[str, str, str | None]] = field(default_factory=list)  # name, type, length


def _statement(gen: _Gen, sc: Scope, enc: _Enc) -> None:
    """One `let` of encode (a parallel operator, or host scalars with `var` and `if`)."""
    kind = gen.pick(["reduce", "map", "scatter", "gather", "storage", "filter", "topk", "custom",
                     "segreduce", "map", "sort", "scan", "packed", "host", "exact",
                     "matmul", "block", "choice"])  # fmt: skip
    name = gen.fresh("a")
    line: str
    if kind == "block":
        _block(gen, sc, enc)
        return
    if kind == "map":
        t = gen.pick([*NUM, "bool"])
        length = gen.length(sc)
        line = f"let {name} = map({length}, {gen.lam(t, sc)});"
        arr = Arr(name, t, length)
    elif kind == "exact":
        t = gen.pick(FLOATS)
        length, lam = gen.exact_lam(t, sc)
        line = f"let {name} = map({length}, {lam});"
        arr = Arr(name, t, length, exact=True)
    elif kind == "packed":
        bits = gen.pick([1, 2, 4, 8])
        length = gen.length(sc)
        lam = gen.lam(gen.pick(NUM[2:]), sc)
        line = f"let {name}: uint<{bits}>[{length}] = map({length}, {lam});"
        arr = Arr(name, "u8", length, bits)
    elif kind == "storage":
        t = gen.pick(["f16", "bf16", "f8e4m3", "f8e5m2", "i8", "i16", "u16"])
        length = gen.length(sc)
        src_t = "f32" if t[0] == "f" else gen.pick(NUM)
        i = gen.fresh("i")
        line = f"let {name} = map({length}, {i} => {t}({gen.expr(src_t, sc.inner(i), 2)}));"
        arr = Arr(name, t, length)
    elif kind in ("reduce", "segreduce"):
        op = gen.pick(["sum", "min", "max", "absmax", "any", "all", "count"])
        t = "bool" if op in ("any", "all", "count") else gen.pick(NUM)
        src, length = gen.source(t, sc, exact=op == "sum")
        rt = "i64" if op == "count" or (op == "sum" and t not in FLOATS) else t
        if kind == "reduce":
            enc.lines.append(f"let {name} = reduce({op}, {src});")
            sc.scalars.append((name, rt))
            enc.values.append((name, rt, None))
            return
        seg = gen.pick(["1", "3", "4", "7", "64", *gen.positive])
        line = f"let {name} = segreduce({op}, {seg}, {src});"
        arr = Arr(name, rt, f"(({length}) + {seg} - 1) / {seg}")
    elif kind == "custom":
        t = gen.pick([*NUM, "bool"])
        if t == "bool":
            comb, init = gen.pick([("a || b", "false"), ("a && b", "true"), ("a != b", "false")])
        elif t in FLOATS:
            comb, init = gen.pick([("max(a, b)", "-1e30"), ("min(a, b)", "1e30")])
        else:
            lo, hi = RANGES[t]
            comb, init = gen.pick([("a + b", "0"), ("a * b", "1"), ("a ^ b", "0"), ("a | b", "0"),
                                   ("max(a, b)", str(lo)), ("min(a, b)", str(hi)),
                                   ("a & b", str(hi if lo == 0 else -1))])  # fmt: skip
        src, _ = gen.source(t, sc)
        if t != "bool":
            init = _lit(t, float(init) if t in FLOATS else int(init))
        enc.lines.append(f"let {name} = reduce((a, b) => {comb}, {init}, {src});")
        sc.scalars.append((name, t))
        enc.values.append((name, t, None))
        return
    elif kind in ("filter", "topk"):
        bound = gen.pick(["min(n, 7)", "n", "1", "(n + 1) / 2"])
        t = "bool" if kind == "filter" else gen.pick(NUM)
        src, _ = gen.source(t, sc)
        cnt = gen.fresh("c")
        enc.lines.append(f"let ({name}, {cnt}) = {kind}({bound}, {src});")
        sc.arrays.append(Arr(name, "i32", bound, count=cnt))
        sc.scalars.append((cnt, "i64"))
        enc.values += [(name, "i32", bound), (cnt, "i64", None)]
        return
    elif kind in ("sort", "scan"):
        t = gen.pick(NUM)
        src, length = gen.source(t, sc)
        op = f"{gen.pick(['sum', 'min', 'max'])}, " if kind == "scan" else ""
        rt = "i64" if op == "sum, " and t not in FLOATS else t
        line = f"let {name} = {kind}({op}{src});"
        arr = Arr(name, rt, length)
    elif kind == "scatter":
        idxs = [a for a in sc.arrays if a.dtype in ("i32", "i64", "u8") and a.bits is None]
        if not idxs:
            return
        idx = gen.pick(idxs)
        t = gen.pick(NUM)  # (float adds at a repeated index run in ascending j everywhere)
        j = gen.fresh("j")
        vals = f"map({idx.length}, {j} => {gen.expr(t, sc.inner(j), 2)})"
        bases = [a for a in sc.arrays if a.dtype == t and a.bits is None]
        if bases and gen.chance(0.5):
            base = gen.pick(bases)
            b, length = base.name, base.length
        else:
            b = length = gen.length(sc)
        count = f", {idx.count}" if idx.count else ""
        if not idx.count and gen.chance(0.3):
            count = f", {gen.pick(['2', 'n'])}"
        # (scatter_set: the last j at a repeated index wins, on every backend)
        f = gen.pick(["scatter", "scatter_set"])
        line = f"let {name} = {f}({b}, {idx.name}, {vals}{count});"
        arr = Arr(name, t, length)
    elif kind == "choice":  # an array chosen by a parameter (both sides of one type)
        if not sc.arrays:  # (a decode of scalar fields)
            return
        a = gen.pick(sc.arrays)
        same = [b for b in sc.arrays if (b.dtype, b.length, b.bits) == (a.dtype, a.length, a.bits)]
        b = gen.pick(same)
        line = f"let {name} = {gen.pick(gen.static)} ? {a.name} : {b.name};"
        count = a.count if a.count == b.count else None
        arr = Arr(name, a.dtype, a.length, a.bits, a.exact and b.exact, count)
    elif kind == "gather":
        idxs = [a for a in sc.arrays if a.dtype in ("i32", "i64", "u8") and a.bits is None]
        if not idxs:
            return
        idx = gen.pick(idxs)
        src = gen.pick(sc.arrays)
        line = f"let {name} = gather({src.name}, {idx.name});"
        arr = Arr(name, src.dtype, idx.length)
    elif kind == "matmul":
        grads = [a for a in sc.arrays if a.exact and a.dtype == "f32" and a.bits is None]
        if not grads:
            return
        # A exact, B in {-1, 0, 1}: each element a sum of exact values, the same in any order;
        # sizes past an operand's end (its definition: those elements read 0), k = 0 (zeros)
        m, k, r = (
            gen.pick(["1", "3"]),
            gen.pick(["0", "2", "n / 3", "n"]),
            gen.pick(["1", "4", "9"]),
        )
        j = gen.fresh("j")
        b = f"map({k} * {r}, {j} => f32({j} % 3) - 1.0)"
        f = gen.pick(["matmul", "matmul_at"])
        line = f"let {name} = {f}({gen.pick(grads).name}, {b}, {m}, {k}, {r});"
        arr = Arr(name, "f32", f"{m} * {r}")
    else:  # host scalars
        t = gen.pick([*NUM, "bool"])
        enc.lines.append(f"let {name}: {t} = {gen.expr(t, sc, 2)};")
        sc.scalars.append((name, t))
        v = gen.fresh("v")
        enc.lines.append(f"var {v}: {t} = {gen.expr(t, sc, 1)};")
        enc.lines.append(gen.if_stmt(v, t, sc, 1))
        sc.scalars.append((v, t))
        enc.values += [(name, t, None), (v, t, None)]
        return
    enc.lines.append(line)
    sc.arrays.append(arr)
    enc.values.append((arr.name, arr.dtype if arr.bits is None else f"uint<{arr.bits}>",
                       arr.length))  # fmt: skip


def _block(gen: _Gen, sc: Scope, enc: _Enc) -> None:
    """A `block(B) { ... }` section: a map, a map reading it at the element and its neighbours
    (0 outside the element's block; for B >= 16, often chosen on a bit of the index), a
    per-block reduction and a map reading it at `[i / B]`; each of them visible after the
    section."""
    size = gen.pick(["1", "2", "4", "8", "16", "32"])
    t = gen.pick(["f32", "f32", "f64", "i32", "i64", "u32"])
    length = gen.length(sc)
    x, y, r, z = gen.fresh("a"), gen.fresh("a"), gen.fresh("a"), gen.fresh("a")
    i = gen.fresh("i")
    near = [f"{x}[{i}]", f"{x}[{i} + 1]", f"{x}[{i} - 1]", f"{x}[{i} ^ 1]"]
    if int(size) > 7:
        near.append(f"{x}[{i} + 7]")
    elif size == "1":
        near = [f"{x}[{i}]", f"{x}[{i} * 2]"]
    shifted = " + ".join(gen.pick(near) for _ in range(gen.draw(st.integers(1, 3))))
    yfn = f"{shifted} + {gen.expr(t, sc.inner(i), 1)}"
    if int(size) >= 16 and gen.chance(0.7):  # a choice on a bit of the index (C: pair loops)
        d, eq = gen.pick(["8", "16"][: int(size) // 16]), gen.pick(["==", "!="])
        yfn = f"({i} & {d}) {eq} 0 ? {yfn} : {x}[{i} + {d}] - {x}[{i} - {d}]"
    op, rt = gen.pick(["min", "max"]), t
    # butterfly stages on x, each read by the next alone (C: a chain in SIMD registers where
    # the block is whole vectors), in any order of distances; the last one is read later
    stages, last = [], []
    if t == "f32" and size != "1" and gen.chance(0.5):
        ds = [1 << k for k in range(int(size).bit_length() - 1)]
        prev = x
        for d in gen.draw(st.permutations(ds))[: gen.draw(st.integers(1, len(ds)))]:
            s = gen.fresh("a")
            stages.append(f"    let {s} = map({length}, {i} => ({i} & {d}) == 0 ? "
                          f"{prev}[{i}] + {prev}[{i} + {d}] : {prev}[{i} - {d}] - {prev}[{i}]);")  # fmt: skip
            prev = s
        last = [Arr(prev, t, length)]
    # a packed map of the section (C: packed into a payload field block by block where that
    # field is its only reader)
    packed: list[Arr] = []
    if gen.chance(0.5):
        q, bits = gen.fresh("a"), gen.pick([1, 2, 4])
        stages.append(f"    let {q}: uint<{bits}>[{length}] = map({length}, {i} => "
                      f"u8({x}[{i}] < {x}[{i} ^ 1] ? {gen.expr('u32', sc.inner(i), 1)} : 3));")  # fmt: skip
        packed = [Arr(q, "u8", length, bits)]
    enc.lines += [
        f"block({size}) {{",
        f"    let {x} = map({length}, {gen.lam(t, sc)});",
        *stages,
        f"    let {y} = map({length}, {i} => {yfn});",
        f"    let {r} = segreduce({op}, {size}, {y});",
        f"    let {z} = map({length}, {i} => {r}[{i} / {size}] == {y}[{i}]);",
        "}",
    ]
    nb = f"(({length}) + {size} - 1) / {size}"
    for arr in (Arr(x, t, length), Arr(y, t, length), Arr(r, rt, nb), Arr(z, "bool", length),
                *last, *packed):  # fmt: skip
        if arr not in packed or gen.chance(0.5):  # (else only the payload may read it)
            sc.arrays.append(arr)
        enc.values.append((arr.name, arr.dtype if arr.bits is None else f"uint<{arr.bits}>",
                           arr.length))  # fmt: skip


def _field_type(t: str, length: str | None) -> str:
    return t if length is None else f"{t}[{length}]"


@st.composite
def programs(draw: st.DrawFn) -> tuple[str, dict[str, object]]:
    """A well-typed program and parameter values to load it with (see module doc)."""
    gen = _Gen(draw)
    top = Scope([("n", "i64")])
    decls = [f'algorithm fuzz{draw(st.integers(0, 9999))} "generated";']
    params: dict[str, object] = {}
    for _ in range(draw(st.integers(0, 3))):
        p = gen.fresh("p")
        t, con, default, other = gen.pick([
            ("f32", " in [0.0, 1.0]", "0.5", 0.25), ("f64", "", "0.25", -3.5),
            ("i64", " in {1, 2, 4}", "2", 4), ("i32", " in [-5, 5]", "0", -5),
            ("u32", "", "7", 0), ("bool", "", "true", False),
        ])  # fmt: skip
        decls.append(f"param {p}: {t}{con} = {default};")
        top.scalars.append((p, t))
        gen.static.append(p if t == "bool" else f"{p} {gen.pick(['<', '==', '!='])} {default}")
        if gen.chance(0.3):
            params[p] = other
    for _ in range(draw(st.integers(0, 2))):
        k = gen.fresh("k")  # lengths: names starting with k
        value = gen.pick(["max(1, min(n, 6))", "n / 2 + 1", "min(n, 3)"])
        decls.append(f"const {k} = {value};")
        top.scalars.append((k, "i64"))
        if value != "min(n, 3)":
            gen.positive.append(k)
    if gen.chance(0.5):
        c = gen.fresh("q")
        t = gen.pick(["f32", "f64", "i32", "bool"])
        decls.append(f"const {c}: {t} = {gen.expr(t, Scope(list(top.scalars)), 1)};")
        top.scalars.append((c, t))
    # functions: scalars in, a scalar out; each may call the ones before it
    fns: list[Fn] = []
    fn_decls = []
    for _ in range(draw(st.integers(0, 2))):
        f = gen.fresh("f")
        ps = tuple(gen.pick([*NUM, "bool"]) for _ in range(draw(st.integers(0, 2))))
        ret = gen.pick([*NUM, "bool"])
        names = [f"x{j}" for j in range(len(ps))]
        fsc = Scope(list(top.scalars) + list(zip(names, ps, strict=True)), fns=list(fns))
        args = ", ".join(f"{a}: {t}" for a, t in zip(names, ps, strict=True))
        b = gen.body(ret, fsc)
        if not b.startswith("{"):
            b = f"{{ return {b}; }}"
        fn_decls.append(f"fn {f}({args}) -> {ret} {b}")
        fns.append(Fn(f, ps, ret))
    # state: error feedback, scalars, another array
    ef = gen.chance(0.6)
    states: list[tuple[str, str, str | None]] = []
    if ef:
        states.append(("residual", "f32", "n"))
    for _ in range(draw(st.integers(0, 2))):
        s = gen.fresh("s")
        t = gen.pick([*NUM, "bool"])
        length = gen.pick([None, None, "min(n, 8)", "n"])
        states.append((s, t, length))
    for s, t, length in states:
        decls.append(f"state {s}: {_field_type(t, length)};")
    g = gen.pick(["g", "grad"])
    sc = Scope(list(top.scalars), [Arr(g, "f32", "n", exact=True)], encode=True, fns=fns)
    for s, t, length in states:
        if length is None:
            sc.scalars.append((s, t))
        else:
            sc.arrays.append(Arr(s, t, length))
    enc = _Enc()
    if ef:
        enc.lines.append(f"let c = map(n, i => {g}[i] + residual[i]);")
        sc.arrays.append(Arr("c", "f32", "n"))
        enc.values.append(("c", "f32", "n"))
    sparse = gen.chance(0.3)
    if sparse:  # a sparse payload: distinct indices, their count and the values sent
        bound = gen.pick(["min(n, 7)", "(n + 1) / 2", "n"])
        op = gen.pick(["filter", "topk"])
        key = gen.lam("bool" if op == "filter" else gen.pick(NUM), sc)
        enc.lines.append(f"let (si, sn) = {op}({bound}, n, {key});")
        src = "c" if ef else g
        enc.lines.append(f"let sv = map({bound}, j => j < sn ? {src}[si[j]] : 0.0);")
        sc.arrays += [Arr("si", "i32", bound, count="sn"), Arr("sv", "f32", bound)]
        sc.scalars.append(("sn", "i64"))
    for _ in range(draw(st.integers(1, 7))):
        _statement(gen, sc, enc)
    for s, t, length in states:
        if length is None and gen.chance(0.8):
            enc.lines.append(f"{s} = {gen.expr(t, sc, 2)};")
        elif length is not None and gen.chance(0.8):
            enc.lines.append(f"{s} = map({length}, {gen.lam(t, sc)});")
    # the payload: the sparse triple, then some of the values computed
    fields: list[tuple[str, str]] = []
    sent: list[str] = []
    if sparse:
        fields += [("cnt", "i64"), ("idx", f"i32[{bound}]"), ("val", f"f32[{bound}]")]
        sent += ["sn", "si", "sv"]
    pool = [v for v in enc.values if v[0] not in sent]
    chosen = draw(st.lists(st.sampled_from(pool), min_size=0 if sent else 1, max_size=4,
                           unique_by=lambda v: v[0])) if pool else []  # fmt: skip
    if not fields and not chosen:
        chosen = [(g, "f32", "n")]
    for name, t, length in chosen:
        fields.append((gen.fresh("F"), _field_type(t, length)))
        sent.append(name)
    decls.append("payload { " + " ".join(f"{f}: {t};" for f, t in fields) + " }")
    enc.lines.append(f"return concat({', '.join(sent)});")
    encode = f"encode({g}) {{\n    " + "\n    ".join(enc.lines) + "\n}"
    decode = _decode(gen, top, fns, fields, sparse)
    tail = [*fn_decls, encode, decode]
    order = draw(st.permutations(range(len(tail))))
    return "\n".join(decls + [tail[j] for j in order]) + "\n", params


def _decode(gen: _Gen, top: Scope, fns: list[Fn], fields: list[tuple[str, str]],
            sparse: bool) -> str:  # fmt: skip
    p = gen.pick(["p", "pl"])
    lines: list[str] = []
    sc = Scope(list(top.scalars), fns=fns)
    unpack = gen.chance(0.3)
    names = [gen.fresh("e") for _ in fields] if unpack else [f"{p}.{f}" for f, _ in fields]
    if unpack and len(fields) > 1:
        lines.append(f"let ({', '.join(names)}) = extract({p});")
    elif unpack:
        names = [f"{p}.{f}" for f, _ in fields]
    for name, (_, t) in zip(names, fields, strict=True):
        m = re.fullmatch(r"(uint<\d>|\w+)\[(.*)\]", t)
        if m is None:
            sc.scalars.append((name, t))
        elif m.group(1).startswith("uint"):
            sc.arrays.append(Arr(name, "u8", m.group(2), int(m.group(1)[5])))
        else:
            sc.arrays.append(Arr(name, m.group(1), m.group(2)))
    if sparse:
        lines.append(f"let s = scatter(n, {names[1]}, {names[2]}, {names[0]});")
        sc.arrays.append(Arr("s", "f32", "n"))
    dec = _Enc(lines)  # decode's own lets: any operator, no random numbers, no state
    for _ in range(gen.draw(st.integers(0, 3))):
        _statement(gen, sc, dec)
    i = gen.fresh("i")
    inner = sc.inner(i)
    first = "s[" + i + "] + " if sparse else ""
    lines.append(f"return map(n, {i} => {first}{gen.expr('f32', inner, 3)});")
    return f"decode({p}) {{\n    " + "\n    ".join(lines) + "\n}"
