"""What the C-family renderers know about one scope of statements (:class:`Body`), how they
read a stored array (:class:`Mem`), and the two versions of a loop body that fast paths give
(:func:`variants`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from hipress.compll.ir import nodes as ir
from hipress.compll.ir.types import DType


@dataclass(frozen=True)
class Mem:
    """How to read a stored array: pointer, length variable, element type, packing.

    ``safe`` is a pointer that may be read at index 0 even when the array is empty (reads at
    other indices clamp into range and select zero, so they need no branch)."""

    ptr: str
    length: str
    dtype: DType
    bits: int | None
    safe: str = ""


@dataclass
class Body:
    """Statements of one scope (a loop body or host code) and what it may assume.

    ``index``: the loop index variable (reads at it, of arrays as long as ``loop_len``, need no
    bounds check); ``fuse``: whether stored maps of this ``level`` read at the index may be
    recomputed (loop items only); ``tile``: the tile offset variable when tile-local buffers
    may be used (unpacked packed arrays, random numbers by block of four); ``aligned``: the
    tile's first index ``i0`` is a multiple of a power of two, at least the tile's length, that
    divides 2**32 (every index of the tile has the upper 32 bits of ``i0``).
    """

    level: int = 0
    index: str | None = None
    loop_len: ir.Expr | None = None
    fuse: bool = False
    tile: str | None = None
    aligned: bool = False
    copy: bool = False
    lines: list[str] = field(default_factory=list)
    hoist: list[str] = field(default_factory=list)  # host code to run before the loop
    memo: dict[tuple[str, str], str] = field(default_factory=dict)
    unpacked: dict[str, str] = field(default_factory=dict)  # array -> tile buffer
    rand_tiles: dict[int, str] = field(default_factory=dict)  # stream -> tile buffer
    # rotated indices ``(index + h) % len`` (tile loops): C text of the expression -> Rotation
    rotations: dict[str, Rotation] = field(default_factory=dict)
    tile_pre: list[str] = field(default_factory=list)  # per-tile code the rotations need
    rot_results: dict[str, Rotation] = field(default_factory=dict)  # C index expr -> Rotation
    safe: dict[str, str] = field(default_factory=dict)  # C index var -> repr(length) it is below
    segments: dict[str, str] = field(default_factory=dict)  # "array/divisor" -> tile buffer
    recompute: frozenset[str] = frozenset()  # stored maps this body computes (a filter's pass)


@dataclass(frozen=True)
class Rotation:
    """``(index + h) % length`` in a tile loop of ``length`` iterations: per tile, ``flag``
    holds when the tile does not wrap around, and then the index is ``index + delta`` (the
    variable ``var``, always within ``[0, length)``), so reads at it are contiguous."""

    flag: str
    var: str
    length: str  # repr of the length expression


# ---------------------------------------------------------------- body variants


_FLAG = re.compile(r"^const bool (fastdiv\d+) = ")
_FLAGS = re.compile(r"\b(?:fastdiv|rotok)\d+\b")


def variants(body: Body, lines: list[str]) -> list[dict[str, object]]:
    """The loop body once, or twice when fast-division flags were hoisted or rotated indices
    used: a version with every flag true (straight-line, vectorisable, contiguous reads) under
    their conjunction, and one with every flag false (exact division, checked reads)
    otherwise."""
    flags = [m.group(1) for m in map(_FLAG.match, body.hoist) if m]
    flags += [r.flag for r in body.rotations.values()]
    if not flags:
        return [{"cond": "", "body": lines}]
    return [
        {"cond": " && ".join(flags), "body": [fix(ln, True) for ln in lines]},
        {"cond": "", "body": [fix(ln, False) for ln in lines]},
    ]


def fix(line: str, fast: bool) -> str:
    """``line`` with every fast-division and rotation flag replaced by 1 (``fast``) or 0."""
    return _FLAGS.sub("1" if fast else "0", line)
