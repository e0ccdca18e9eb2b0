"""Loop-index analyses of the C-family emitter: a 64-bit division whose operands stay below
2^53 runs in double precision (the loop is unswitched on a hoisted range check), and a rotated
index ``(i + h) % n`` reads contiguously within a tile that does not wrap around (the tile loop
is unswitched on a per-tile flag), and a per-segment read ``a[i / d]`` is read once per run of
a tile's elements in one segment."""

from __future__ import annotations

from typing import Protocol

from hipress.compll.backends.cfamily.body import Body, Rotation
from hipress.compll.backends.cfamily.syntax import Names
from hipress.compll.ir import nodes as ir
from hipress.compll.ir import ops


class Emitter(Protocol):
    """What the analyses use of the emitter calling them
    (:class:`~hipress.compll.backends.cfamily.expr.Emitter`)."""

    names: Names

    def expr(self, e: ir.Expr, body: Body, env: dict[str, str]) -> str: ...

    def invariant(self, e: ir.Expr, env: dict[str, str]) -> bool: ...

    def length(self, e: ir.Expr) -> str: ...


def is_segment_index(em: Emitter, x: ir.Load, index: str, env: dict[str, str]) -> bool:
    """Whether ``x`` reads at ``i / d``: ``i`` the loop's index (the variable ``env`` binds to
    ``index``), ``d`` loop-invariant."""
    e = x.index
    return (
        isinstance(e, ir.Binary)
        and e.op == ops.DIV.name
        and e.dtype.name == "i64"
        and isinstance(e.a, ir.Ref)
        and env.get(e.a.name) == index
        and em.invariant(e.b, env)
    )


def segment_runs(t: str, step: str = "") -> tuple[str, str]:
    """C of a loop over the runs of a tile's elements that lie in one segment (segments of
    ``sd`` elements; the tile starts at element ``i0 >= 0`` and has ``tl``): its header, with
    ``t`` from 0 and the segment ``sq`` and the elements ``rem`` left in it advanced from run to
    run without a division (``step``: more to advance, e.g. ``", ns++"``), and the line giving
    the end ``e`` of the run in the tile. The body ends with ``t = e``."""
    head = (f"for (int64_t {t} = 0, sq = i0 / sd, rem = sd - i0 % sd; {t} < tl; "
            f"sq++, rem = sd{step}) {{")  # fmt: skip
    return head, f"const int64_t e = rem >= tl - {t} ? tl : {t} + rem;"


def _sum(terms: list[ir.Expr]) -> ir.Expr:
    out = terms[0]
    for t in terms[1:]:
        out = ir.Binary("add", out, t, out.dtype)
    return out


def fast_division(em: Emitter, e: ir.Binary, body: Body, env: dict[str, str]) -> str | None:
    """A hoisted flag that holds when every dividend of ``e`` in this loop and its
    loop-invariant divisor are below 2^53 in magnitude (and the divisor is not 0): the
    dividend must be ``c * index + h`` with constant ``c`` and loop-invariant ``h``."""
    if isinstance(e.b, ir.Const):  # the C compiler strength-reduces constant divisors
        return None
    aff = _affine(em, e.a, body, env)
    if aff is None or not em.invariant(e.b, env) or body.loop_len is None:
        return None
    coef, terms = aff
    if abs(coef) > 1024:
        return None
    host = Body(level=body.level)
    h = " + ".join(f"fabs((double)({em.expr(t, host, {})}))" for t in terms) or "0.0"
    d = em.expr(e.b, host, {})
    if host.lines:  # pragma: no cover - invariant expressions read no arrays
        return None
    flag = em.names.fresh("fastdiv")
    ln = em.length(body.loop_len)
    body.hoist.append(
        f"const bool {flag} = ({h}) <= 0x1p51 && {ln} <= (INT64_C(1) << 40) && ({d}) != 0 "
        f"&& fabs((double)({d})) < 0x1p53;"
    )
    return flag


def rotation(
    em: Emitter, e: ir.Binary, key: str, body: Body, env: dict[str, str]
) -> Rotation | None:
    """The :class:`Rotation` for ``e = (index + h) % d`` (C text ``key``), when ``h`` and
    ``d`` are loop-invariant and ``d`` is the loop's own length; registered in ``body``."""
    if key in body.rotations:
        return body.rotations[key]
    if body.loop_len is None or repr(e.b) != repr(body.loop_len):
        return None
    terms = _index_plus(em, e.a, body, env)
    if terms is None or not em.invariant(e.b, env):
        return None
    host = Body(level=body.level)
    h = em.expr(_sum(terms), host, {}) if terms else "INT64_C(0)"
    d = em.expr(e.b, host, {})
    if host.lines:  # pragma: no cover - invariant expressions read no arrays
        return None
    k = em.names.fresh("rot")
    rot = Rotation(flag=f"rotok{k[3:]}", var=f"jr{k[3:]}", length=repr(e.b))
    # i0 + h wraps like the program's own add; below INT64_MAX - HP_TILE, adding t can't
    body.tile_pre += [
        f"const int64_t {k}s = hp_add_i64(i0, {h});",
        f"const bool {rot.flag} = {k}s >= 0 && {k}s <= INT64_MAX - HP_TILE && "
        f"{k}s % ({d}) + tl <= ({d});",
        f"const int64_t {k}d = {rot.flag} ? {k}s % ({d}) - i0 : 0;",
    ]
    body.lines.append(f"const int64_t {rot.var} = {body.index} + {k}d;")
    body.rotations[key] = rot
    body.safe[rot.var] = rot.length
    return rot


def _index_plus(em: Emitter, e: ir.Expr, body: Body, env: dict[str, str]) -> list[ir.Expr] | None:
    """``e`` as ``index + sum(terms)`` (i64 adds only, terms loop-invariant), or None."""
    if isinstance(e, ir.Ref) and env.get(e.name) == body.index:
        return []
    if isinstance(e, ir.Binary) and e.op == "add" and e.dtype.name == "i64":
        for x, y in ((e.a, e.b), (e.b, e.a)):
            if em.invariant(y, env):
                inner = _index_plus(em, x, body, env)
                if inner is not None:
                    return [*inner, y]
    return None


def _affine(
    em: Emitter, e: ir.Expr, body: Body, env: dict[str, str]
) -> tuple[int, list[ir.Expr]] | None:
    """``e`` as ``c * index + sum(terms)`` (terms loop-invariant), or None."""
    if isinstance(e, ir.Ref) and env.get(e.name) == body.index:
        return 1, []
    if isinstance(e, ir.Binary) and e.op in ("add", "sub"):
        for x, y, sign_ok in ((e.a, e.b, True), (e.b, e.a, e.op == "add")):
            if sign_ok and em.invariant(y, env):
                inner = _affine(em, x, body, env)
                if inner is not None:
                    return inner[0], [*inner[1], y]
        return None
    if isinstance(e, ir.Binary) and e.op == "mul":
        for x, y in ((e.a, e.b), (e.b, e.a)):
            if isinstance(y, ir.Const):
                inner = _affine(em, x, body, env)
                if inner is not None and not inner[1]:
                    return inner[0] * int(y.value), []
    return None
