"""Planner pass: maps deferred to a filter (see :class:`hipress.compll.lower.kernel_plan.FilterFusion`).

A filter over ``n`` elements reads every element once. When what it reads is a map that the
encode also stores as new state (graddrop's compensated gradient, dgc's momentum and
accumulation), storing that map is a pass of its own, and the filter a second one over the
result. Deferred to the filter, the map is stored at the filter's level instead, and a target
may compute and store it inside the filter's pass: one pass over memory. Readers before that
level recompute it from its inputs, which are still unchanged then.

A map can be deferred when it is new state only (no payload field or decode output), unpacked,
as long as the filter, free of random numbers, and reads only the gradient, state and other such
maps, each at its own index; and the filter reads it (through inlined maps) at one index only:
its own ``[j]``, or ``[(j + h) % n]`` with ``h`` a host expression (which covers every index once
when ``0 <= h < n``, checked at run time). A top-k's key is the same to it, read at ``[j]`` only
(topk's compensated gradient): its first pass over the keys stores the map, the later ones read
it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from hipress.compll.ir import nodes as ir
from hipress.compll.ir import ops
from hipress.compll.ir.walk import lambda_exprs, walk
from hipress.compll.lower.kernel_plan import Array, Destination


class Planned(Protocol):
    """What :func:`deferrable` reads of the planner: the function's ops, its arrays and maps,
    and where the stored ones live so far."""

    @property
    def ops(self) -> Sequence[ir.Op]: ...

    @property
    def arrays(self) -> Mapping[str, Array]: ...

    @property
    def maps(self) -> Mapping[str, ir.Map]: ...

    @property
    def homes(self) -> Mapping[str, Destination]: ...

    def is_virtual(self, name: str) -> bool: ...


@dataclass(frozen=True)
class Deferral:
    """A map deferred to the filter that is op number ``filter`` of the function; the filter
    reads it at ``index``, an expression of its parameter ``param`` (``param`` itself, or rotated
    by ``offset``)."""

    filter: int
    index: ir.Expr
    param: str
    offset: ir.Expr | None


def deferrable(
    pl: Planned,
    sinks: Mapping[str, Sequence[Destination]],
    uses: Mapping[str, Sequence[tuple[int, bool]]],
) -> tuple[dict[str, Deferral], frozenset[str]]:
    """The stored maps each filter may compute in its own pass (see the module docstring):
    new state only (no payload or decode output), unpacked, as long as the filter, free of
    random numbers, reading only the gradient, state and other such maps, and each of those
    at its own index; read by the filter (through inlined maps) at one index only, the
    filter's own ``[j]`` or ``[(j + h) % n]`` (``h`` a host expression). Also returned: the
    workspace maps of the same kind read only by those (at their index), which become virtual
    (the caller removes them from its homes): the filter's pass computes them in registers."""
    cands = {
        name
        for name, ts in sinks.items()
        if name in pl.maps
        and all(t.kind == "state" for t in ts)
        and pl.maps[name].type.bits is None
    }
    helpers = {
        name
        for name in pl.maps
        if name not in sinks and name in pl.homes and pl.maps[name].type.bits is None
    }
    ok = {c for c in cands | helpers if _elementwise(pl, c, cands | helpers)}
    cands, helpers = cands & ok, helpers & ok
    out: dict[str, Deferral] = {}
    for k, op in enumerate(pl.ops):
        if not isinstance(op, ir.Filter | ir.TopK):
            continue
        lam = op.pred if isinstance(op, ir.Filter) else op.key
        if not lam.params:
            continue
        j = lam.params[0].name
        forms: dict[str, set[str | None]] = {}
        at: dict[str, ir.Expr] = {}
        for e in lambda_exprs(lam):
            for x in walk(e):
                if isinstance(x, ir.Load):
                    f = filter_index(x.index, lam, op.length)
                    if isinstance(op, ir.TopK) and not isinstance(f, ir.Ref):
                        f = None  # a top-k stores them in its first pass, read at [j] only
                    if f is not None:
                        at.setdefault(repr(f), x.index)
                    _forms(pl, x.array, None if f is None else repr(f), forms, cands)
        for name in sorted(cands):
            fs = forms.get(name, set())
            if name in out or len(fs) != 1 or None in fs or pl.maps[name].type.length != op.length:
                continue
            index = at[next(iter(fs))]  # type: ignore[index]
            offset = None if isinstance(index, ir.Ref) else rot_offset(index)
            out[name] = Deferral(k, index, j, offset)
    names = [op.name if isinstance(op, ir.Map) else None for op in pl.ops]
    virtual = frozenset(
        h
        for h in helpers
        if uses.get(h) and all(al and names[c] in out for c, al in uses.get(h, ()))
    )
    return out, virtual


def _forms(
    pl: Planned, name: str, form: str | None, forms: dict[str, set[str | None]], cands: set[str]
) -> None:
    """Record that array ``name`` is read at ``form`` (None: any other index), and walk
    the maps it inlines: a read at a lambda's own parameter has the lambda's form."""
    fs = forms.setdefault(name, set())
    if form in fs:
        return
    fs.add(form)
    if name not in pl.maps or not (pl.is_virtual(name) or name in cands):
        return
    fn = pl.maps[name].fn
    param = fn.params[0].name
    for e in lambda_exprs(fn):
        for x in walk(e):
            if isinstance(x, ir.Load):
                own = isinstance(x.index, ir.Ref) and x.index.name == param
                _forms(pl, x.array, form if own else None, forms, cands)


def _elementwise(
    pl: Planned, name: str, cands: set[str], seen: frozenset[str] = frozenset()
) -> bool:
    """Whether map ``name`` at index ``i`` needs only the gradient, state and other such
    maps (virtual or ``cands``) at ``i``, and no random numbers."""
    fn = pl.maps[name].fn
    param = fn.params[0].name
    for e in lambda_exprs(fn):
        for x in walk(e):
            if isinstance(x, ir.Rand):
                return False
            if not isinstance(x, ir.Load):
                continue
            if not (isinstance(x.index, ir.Ref) and x.index.name == param):
                return False
            a = pl.arrays[x.array]
            if a.length != pl.maps[name].type.length:
                return False
            if a.origin in ("grad", "state"):
                continue
            if x.array not in pl.maps or not (pl.is_virtual(x.array) or x.array in cands):
                return False
            if x.array not in seen and not _elementwise(pl, x.array, cands, seen | {name}):
                return False
    return True


def filter_index(index: ir.Expr, pred: ir.Lambda, length: ir.Expr) -> ir.Expr | None:
    """``index`` if it is the filter's own index: its parameter ``j``, or ``(j + h) % length``
    with ``h`` a host expression (no loads, random numbers or names local to ``pred``); else
    None."""
    j = pred.params[0].name
    if isinstance(index, ir.Ref) and index.name == j:
        return index
    h = rot_offset(index)
    if h is None or not isinstance(index, ir.Binary) or index.b != length:
        return None
    a = index.a
    if not (isinstance(a, ir.Binary) and isinstance(a.a, ir.Ref) and a.a.name == j):
        return None
    local = {j} | {name for name, _ in pred.lets}
    for x in walk(h):
        if isinstance(x, ir.Load | ir.Rand) or (isinstance(x, ir.Ref) and x.name in local):
            return None
    return index


def rot_offset(index: ir.Expr) -> ir.Expr | None:
    """``h`` of an i64 ``(j + h) % d`` (any ``j``), or None."""
    if (
        isinstance(index, ir.Binary)
        and index.op == ops.MOD.name
        and index.dtype.name == "i64"
        and isinstance(index.a, ir.Binary)
        and index.a.op == ops.ADD.name
        and index.a.dtype.name == "i64"
    ):
        return index.a.b
    return None
