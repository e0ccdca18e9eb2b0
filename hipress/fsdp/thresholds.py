"""Whether an algorithm's own error feedback survives being stored in bfloat16:
:func:`threshold_compare`.

``feedback="bf16"`` rounds an algorithm's float32 state arrays to bfloat16 between steps. For a
state whose residual is a smooth function of its arrays (onebit's and efsignsgd's compensated
gradient less its scale, tbq's residual), that only rounds the residual. A sparsifier (topk,
graddrop, dgc) instead keeps the last compensated gradient and tells the elements it sent from
those it kept by comparing each of them with a threshold it stored as a float32 scalar. Rounding
the array but not the threshold moves elements across it: a kept element that rounds above it
counts as sent and its gradient is dropped, a sent one that rounds below it is sent again. So
the untransmitted gradient drifts away, step after step, and no rounding of two bytes per
element avoids it. This module finds such a comparison in a CompLL program's ``encode``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from hipress.compll.ir import nodes
from hipress.compll.ir.types import ArrayType

__all__ = ["threshold_compare"]

COMPARISONS = frozenset({"eq", "ne", "lt", "le", "gt", "ge"})


def threshold_compare(algorithm: Any) -> tuple[str, str] | None:
    """``(array, scalar)``: a float32 state array of ``algorithm``'s encode compared with a state
    scalar (through any ``let``), or None if there is none or ``algorithm`` is not a CompLL
    algorithm. Pure."""
    program = getattr(algorithm, "program", None)
    if not isinstance(program, nodes.Program):
        return None
    arrays = {s.name for s in program.state
              if isinstance(s.type, ArrayType) and s.type.dtype.name == "f32"}  # fmt: skip
    scalars = {s.name for s in program.state if not isinstance(s.type, ArrayType)}
    host: dict[str, frozenset[str]] = {}
    for op in program.encode.ops:
        if isinstance(op, nodes.Let):
            found = _scan(op.value, host, arrays, scalars)
            if isinstance(found, tuple):
                return found
            host[op.name] = found
            continue
        for f in dataclasses.fields(op):
            value = getattr(op, f.name)
            if isinstance(value, nodes.Lambda):
                env = dict(host)
                for name, expr in value.lets:
                    got = _scan(expr, env, arrays, scalars)
                    if isinstance(got, tuple):
                        return got
                    env[name] = got
                got = _scan(value.result, env, arrays, scalars)
                if isinstance(got, tuple):
                    return got
    return None


def _scan(
    expr: Any, env: Mapping[str, frozenset[str]], arrays: set[str], scalars: set[str]
) -> frozenset[str] | tuple[str, str]:
    """The state entries ``expr`` reads, or the first ``(array, scalar)`` it compares."""
    if isinstance(expr, nodes.Ref):
        if expr.name in scalars:
            return frozenset({expr.name})
        return env.get(expr.name, frozenset())
    reads: set[str] = set()
    if isinstance(expr, nodes.Load) and expr.array in arrays:
        reads.add(expr.array)
    sides: list[frozenset[str]] = []
    for f in dataclasses.fields(expr) if dataclasses.is_dataclass(expr) else ():
        child = getattr(expr, f.name)
        if not dataclasses.is_dataclass(child) or isinstance(child, nodes.DType):
            continue
        got = _scan(child, env, arrays, scalars)
        if isinstance(got, tuple):
            return got
        sides.append(got)
        reads |= got
    if isinstance(expr, nodes.Binary) and expr.op in COMPARISONS and len(sides) == 2:
        for a, b in (sides, sides[::-1]):
            if a & arrays and b & scalars:
                return sorted(a & arrays)[0], sorted(b & scalars)[0]
    return frozenset(reads)
