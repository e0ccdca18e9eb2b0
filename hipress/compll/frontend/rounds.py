"""Multi-round algorithms: their layout checked, and each split into single-round stages.

A multi-round algorithm names its payloads (``payload p { ... }``), one per round, and has one
``encode`` per round, ``encode(g, <earlier payloads>) -> <its payload>``, then one
``decode(g, <every payload>)``. Every round's payload is summed over the workers (all-reduce),
so its fields are ``f32``. Each encode and the decode becomes one ordinary single-round module
(a *stage*) that the ordinary checker elaborates and every backend runs:

- the stage's payload is its round's (the decode's: ``{ out: f32[n]; }``, the result);
- the summed payloads it reads are state, ``<payload>_<field>``, which the runtime fills
  before it runs the stage (``p.F`` reads ``p_F``);
- ``rows`` (a parameter the runtime sets from the gradient's shape), ``cols = n / rows`` and
  ``world`` (state: the number of workers) are predeclared;
- its own decode is a placeholder that is never run.

Every stage declares the same state, so one :class:`~hipress.compll.ir.state.State` carries
through a step's rounds.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hipress.compll.frontend import ast
from hipress.compll.ir.source import CllTypeError, SourceFile, Span

PREDECLARED = ("rows", "cols", "world")
RESULT = "out"  # the decode stage's one payload field
MAX_ROWS = 2147483647

_PRELUDE = f"""param rows: i64 in [1, {MAX_ROWS}] = 1;
const cols = n / rows;
state world: i64;
payload {{ {RESULT}: f32[n]; }}
decode(p) {{ return map(n, i => 0.0); }}
"""


@dataclass(frozen=True)
class Stages:
    """A multi-round algorithm split: ``modules[k]`` is round k's encode (the last one the
    decode); ``payloads`` the rounds' payload declarations in order."""

    algo: ast.AlgorithmDecl
    payloads: tuple[ast.PayloadDecl, ...]
    modules: tuple[ast.Module, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name or "" for p in self.payloads)


def is_rounds(module: ast.Module) -> bool:
    """Whether ``module`` is written as a multi-round algorithm (a named payload, an encode
    with more than one argument or a ``->``, or a decode with more than one argument)."""
    for d in module.decls:
        if isinstance(d, ast.PayloadDecl) and d.name is not None:
            return True
        if isinstance(d, ast.EncodeDecl) and (d.inputs or d.target is not None):
            return True
        if isinstance(d, ast.DecodeDecl) and d.inputs:
            return True
    return False


def _err(src: SourceFile, msg: str, span: Span) -> CllTypeError:
    return CllTypeError(msg, src, span)


def _payloads(src: SourceFile, decls: tuple[ast.Decl, ...], at: Span) -> list[ast.PayloadDecl]:
    payloads = [d for d in decls if isinstance(d, ast.PayloadDecl)]
    if not payloads:
        raise _err(src, "algorithm has no `payload NAME { ... }` declaration", at)
    seen: dict[str, Span] = {}
    for p in payloads:
        if p.name is None:
            raise _err(
                src,
                "a multi-round algorithm names every payload, one per round: "
                "`payload NAME { ... }`",
                p.span,
            )
        if p.name in seen:
            raise _err(
                src,
                f"payload `{p.name}` is declared twice (first at line {seen[p.name].line})",
                p.span,
            )
        seen[p.name] = p.span
        for f in p.fields:
            t = f.type
            scalar = isinstance(t, ast.ScalarTypeAnn) and t.name == "f32"
            array = isinstance(t, ast.ArrayTypeAnn) and t.elem == "f32"
            if not (scalar or array):
                raise _err(
                    src,
                    f"payload field `{p.name}.{f.name}` must be f32 (a scalar or an array): "
                    "a round's payload is summed over the workers (all-reduce)",
                    f.span,
                )
    return payloads


def _signatures(src: SourceFile, decls: tuple[ast.Decl, ...], names: list[str],
                at: Span) -> tuple[list[ast.EncodeDecl], ast.DecodeDecl]:  # fmt: skip
    """The encodes, in round order, and the decode; raises unless each takes what it must."""
    encodes = [d for d in decls if isinstance(d, ast.EncodeDecl)]
    decodes = [d for d in decls if isinstance(d, ast.DecodeDecl)]
    if len(encodes) != len(names):
        where = encodes[len(names)].span if len(encodes) > len(names) else at
        raise _err(
            src,
            f"{len(names)} payload(s) need {len(names)} encode(s), one per round in the "
            f"payloads' order; found {len(encodes)}",
            where,
        )
    for k, e in enumerate(encodes):
        want = f"encode({', '.join([e.arg, *names[:k]])}) -> {names[k]}"
        if e.target != names[k] or list(e.inputs) != names[:k]:
            raise _err(
                src,
                f"round {k + 1}'s encode takes the gradient and the payloads of the rounds "
                f"before it, and produces payload `{names[k]}`: write `{want}`",
                e.span,
            )
    if not decodes:
        raise _err(src, "algorithm has no `decode` function", at)
    if len(decodes) > 1:
        raise _err(src, "more than one `decode` function", decodes[1].span)
    dec = decodes[0]
    if list(dec.inputs) != names:
        raise _err(
            src,
            "a multi-round decode takes the gradient and every round's summed payload: "
            f"write `decode({', '.join([dec.arg, *names])})`",
            dec.span,
        )
    return encodes, dec


def _rewrite(src: SourceFile, node: object, fields: dict[str, set[str]]) -> object:
    """``node`` with every ``p.F`` of an input payload ``p`` read as the state ``p_F``."""
    if isinstance(node, ast.Field) and isinstance(node.base, ast.Name):
        p = node.base.id
        if p in fields:
            if node.name not in fields[p]:
                raise _err(src, f"payload `{p}` has no field `{node.name}`", node.span)
            return ast.Name(f"{p}_{node.name}", node.span)
    if isinstance(node, ast.Name) and node.id in fields:
        raise _err(
            src,
            f"read the summed payload `{node.id}` by its fields: `{node.id}.FIELD`",
            node.span,
        )
    if isinstance(node, tuple):
        return tuple(_rewrite(src, x, fields) for x in node)
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        changes = {
            f.name: _rewrite(src, getattr(node, f.name), fields)
            for f in dataclasses.fields(node)
            if f.name != "span"
        }
        return dataclasses.replace(node, **changes)
    return node


def _reserved(
    src: SourceFile, decls: tuple[ast.Decl, ...], payloads: list[ast.PayloadDecl]
) -> None:
    inbox = {f"{p.name}_{f.name}": f"{p.name}.{f.name}" for p in payloads for f in p.fields}
    for d in decls:
        if not isinstance(d, ast.ParamDecl | ast.ConstDecl | ast.StateDecl | ast.FnDecl):
            continue
        if d.name in PREDECLARED:
            raise _err(
                src,
                f"`{d.name}` is predeclared in a multi-round algorithm (rows and cols: the "
                "gradient's 2-D view; world: the number of workers)",
                d.span,
            )
        if d.name in inbox:
            raise _err(
                src,
                f"`{d.name}` names the summed payload field {inbox[d.name]} in a multi-round "
                "algorithm; rename this declaration",
                d.span,
            )


def split(src: SourceFile, module: ast.Module) -> Stages:
    """Check a multi-round module's layout and split it into its stages (each then checked as
    an ordinary module). Raises :class:`CllTypeError` with a span on a misuse."""
    decls = module.decls
    algo = next((d for d in decls if isinstance(d, ast.AlgorithmDecl)), None)
    if algo is None:
        raise CllTypeError("missing `algorithm NAME;` declaration", src, Span(1, 1, 1, 2))
    payloads = _payloads(src, decls, algo.span)
    names = [p.name or "" for p in payloads]
    encodes, dec = _signatures(src, decls, names, algo.span)
    _reserved(src, decls, payloads)
    from hipress.compll.frontend.parse import parse

    prelude = parse(SourceFile("<multi-round prelude>", _PRELUDE)).decls
    head, result, placeholder = prelude[:3], prelude[3], prelude[4]
    inbox = tuple(
        ast.StateDecl(f"{p.name}_{f.name}", f.type, f.span) for p in payloads for f in p.fields
    )
    common = tuple(
        d for d in decls if not isinstance(d, ast.PayloadDecl | ast.EncodeDecl | ast.DecodeDecl)
    )
    modules = []
    by_name = {p.name: {f.name for f in p.fields} for p in payloads}
    for k, e in enumerate(encodes):
        body = _rewrite(src, e.body, {q: by_name[q] for q in names[:k]})
        enc = ast.EncodeDecl(e.arg, body, e.span)  # type: ignore[arg-type]
        own = dataclasses.replace(payloads[k], name=None)
        modules.append(ast.Module((*head, *common, *inbox, own, enc, placeholder)))
    body = _rewrite(src, dec.body, by_name)
    modules.append(
        ast.Module((*head, *common, *inbox, result, _as_encode(src, dec, body), placeholder))
    )
    return Stages(algo, tuple(payloads), tuple(modules))


def _as_encode(src: SourceFile, dec: ast.DecodeDecl, body: object) -> ast.EncodeDecl:
    """The decode as the encode of its stage: ``return x;`` becomes ``return concat(x);``."""
    assert isinstance(body, ast.Block)
    stmts = list(body.stmts)
    if stmts and isinstance(stmts[-1], ast.Return):
        ret = stmts[-1]
        call = ast.Call("concat", (ret.value,), ret.value.span, ret.value.span)
        stmts[-1] = ast.Return(call, ret.span)
    return ast.EncodeDecl(dec.arg, ast.Block(tuple(stmts), body.span), dec.span)
