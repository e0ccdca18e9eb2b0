"""What elaboration works over: values, scopes, the emission context and the checker's state.

Every ``check_*`` module is a set of functions taking an :class:`Elab` (the state of checking one
program) first. Expressions contain lambdas and inlined function bodies, which contain
statements, which contain expressions: :mod:`hipress.compll.frontend.check_expr` reaches the
two kinds of call whose elaboration holds statements (parallel operators and user functions)
through the :class:`Elab`'s ``parallel`` and ``inline`` fields, which
:mod:`hipress.compll.frontend.check` fills in. Every other call between the modules goes
downwards.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hipress.compll.frontend import ast
from hipress.compll.ir import nodes as ir
from hipress.compll.ir import ops
from hipress.compll.ir.source import CllTypeError, SourceFile, Span
from hipress.compll.ir.types import F32, I64, SCALAR_TYPES, ArrayType, DType

# ---------------------------------------------------------------- the language's builtin names

MATH1 = ops.MATH_BUILTINS
BIT_BUILTINS = (*ops.BIT_CASTS, ops.EXPONENT.name, ops.LDEXP.name, ops.HASH.name)
PARALLEL = (
    "map", "reduce", "segreduce", "filter", "topk", "sort", "scan", "scatter", "scatter_set",
    "gather", "matmul", "matmul_at",
)  # fmt: skip
RANDOM = ("urand", "uniform", "randint")
MINMAX = (ops.MIN.name, ops.MAX.name)
BUILTINS = (*MATH1, *MINMAX, "clamp", *BIT_BUILTINS, *PARALLEL, *RANDOM, "concat", "extract")
N_REF = ir.Ref(ir.N, I64)
# predeclared values (f32, adapting like float literals); they live in a scope above the
# program's, so a declaration of the same name (const, param, let, parameter) hides them
CONSTANTS = {"inf": float("inf"), "nan": float("nan")}
# functions people reach for that the language leaves out: each backend rounds them differently
_ROUNDED = "backends round it differently, so it is not in the language"
MISSING_MATH = {
    "log2": f"{_ROUNDED}; `exponent(x)` is floor(log2(|x|)), exactly",
    "exp2": f"{_ROUNDED}; `ldexp(1.0, e)` is 2^e for an integer e, exactly",
    "log": _ROUNDED,
    "exp": _ROUNDED,
    "pow": f"{_ROUNDED}; `ldexp(x, e)` is x * 2^e, exactly",
}
MAX_CALL_DEPTH = 32  # functions are inlined: a chain of calls nests that deep

# ---------------------------------------------------------------- values in scope


@dataclass(frozen=True)
class Scalar:
    """A scalar value: an IR expression (``lit``: an untyped literal that adapts to the other
    operand)."""

    expr: ir.Expr
    lit: bool = False

    @property
    def dtype(self) -> DType:
        return self.expr.dtype


@dataclass(frozen=True)
class Array:
    """An array value: an SSA array name and its type."""

    name: str
    type: ArrayType


@dataclass(frozen=True)
class Tuple_:
    """Several values (what filter, topk and extract return)."""

    items: tuple[Scalar | Array, ...]


Value = Scalar | Array | Tuple_


@dataclass
class Binding:
    value: Value
    kind: str  # "let" | "var" | "assigned" | "state" | "param" | "const" | "payload" | "builtin"
    # | "loop" (a loop's counter)


class Scope:
    """Names bound in one block, chained to the enclosing block's scope."""

    def __init__(self, parent: Scope | None = None, boundary: bool = False) -> None:
        self.parent = parent
        self.names: dict[str, Binding] = {}
        self.boundary = boundary  # a lambda or fn body: outer variables are read-only

    def owned_inside(self, name: str) -> bool:
        """Whether ``name`` is defined at or below the nearest boundary scope."""
        s: Scope | None = self
        while s is not None:
            if name in s.names:
                return True
            if s.boundary:
                return False
            s = s.parent
        return False

    def lookup(self, name: str) -> Binding | None:
        """The binding of ``name`` in this scope or the nearest enclosing one that has it."""
        owner = self.owner(name)
        return owner.names[name] if owner is not None else None

    def owner(self, name: str) -> Scope | None:
        """The scope that binds ``name``, None when none does."""
        s: Scope | None = self
        while s is not None:
            if name in s.names:
                return s
            s = s.parent
        return None


def constant_scope() -> Scope:
    """A scope holding :data:`CONSTANTS`, the parent of a program's top scope."""
    s = Scope()
    for name, v in CONSTANTS.items():
        s.names[name] = Binding(Scalar(ir.Const(v, F32), True), "builtin")
    return s


class Ctx:
    """Where code is being emitted: host ops, or the lets of a lambda."""

    def __init__(self, host: bool, in_encode: bool, ops: list[Any]) -> None:
        self.host = host
        self.in_encode = in_encode
        self.ops = ops  # host: list[ir.Op]; lambda: list[tuple[str, ir.Expr]]
        self.in_branch = False  # inside an `if` branch
        self.no_parallel = False  # inside an inlined fn
        self.in_loop = False  # inside a `for` body
        self.block: Any = None  # the `block(...)` section being elaborated (check_block)


# ---------------------------------------------------------------- the checker's state

# parallel(cx, call, scope, ctx, name_hint, expected array type, names to bind)
ParallelFn = Callable[
    ["Elab", ast.Call, Scope, Ctx, str, ArrayType | None, tuple[str, ...] | None], Value
]
# inline(cx, call, scope, ctx, name_hint): a call of a user function, inlined
InlineFn = Callable[["Elab", ast.Call, Scope, Ctx, str], Value]


@dataclass
class Elab:
    """The state of checking one program: its source, parameter values, functions, the SSA
    names used so far and what encode has assigned; plus the two elaboration entry points that
    expressions reach upwards (see the module docstring)."""

    src: SourceFile
    values: dict[str, Any]
    parallel: ParallelFn
    inline: InlineFn
    top: Scope = field(default_factory=Scope)
    used: dict[str, int] = field(default_factory=dict)
    fns: dict[str, ast.FnDecl] = field(default_factory=dict)
    fn_stack: list[str] = field(default_factory=list)
    called: set[str] = field(default_factory=set)  # functions some call has inlined
    declared: dict[str, Span] = field(default_factory=dict)  # top-level declarations
    unrolled: int = 0  # loop iterations unrolled so far
    state_assigned: dict[str, Span] = field(default_factory=dict)
    hidden_state: set[str] = field(default_factory=set)  # state names decode may not read
    payload_fields: dict[str, Scalar | Array] = field(default_factory=dict)

    def err(self, msg: str, span: Span | None) -> CllTypeError:
        """A type error at ``span`` of this program's source (returned, for ``raise``)."""
        return CllTypeError(msg, self.src, span)

    def fresh(self, base: str) -> str:
        """A new SSA name: ``base``, then ``base.1``, ``base.2``..."""
        k = self.used.get(base, 0)
        self.used[base] = k + 1
        return base if k == 0 else f"{base}.{k}"


def arity(cx: Elab, e: ast.Call, n: int) -> None:
    """Raise unless call ``e`` has ``n`` arguments."""
    if len(e.args) != n:
        raise cx.err(f"`{e.func}` takes {n} argument(s), got {len(e.args)}", e.span)


def suggest(cx: Elab, name: str, scope: Scope, call: bool = False) -> str:
    """``"; did you mean `x`?"`` for the closest known name to ``name`` (a function's, when
    ``call``), the reason a function the language leaves out is missing, or ``""``."""
    if call and name in MISSING_MATH:
        return f"; {MISSING_MATH[name]}"
    pool: set[str] = set(BUILTINS) | set(SCALAR_TYPES) | set(cx.fns)
    s: Scope | None = None if call else scope
    while s is not None:
        pool |= set(s.names)
        s = s.parent
    close = difflib.get_close_matches(name, sorted(pool), n=1)
    return f"; did you mean `{close[0]}`?" if close else ""
