"""The kernel plan: what :func:`hipress.compll.lower.lower.lower` produces from the IR and every
native target renders (loops of fused items, stages of their own, host scalars, where each
array lives), and the rule by which a reader recomputes a stored map instead of loading it.

A plan is immutable (frozen dataclasses, tuples and read-only mappings): each planner pass
(:mod:`~hipress.compll.lower.fuse`, :mod:`~hipress.compll.lower.finite`) returns a new plan.
Renderers tell loops and stages apart by identity, so a pass that replaces a loop replaces it
everywhere it appears (:func:`replace_loop`)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Protocol, TypeVar

from hipress.compll.ir import nodes as ir
from hipress.compll.ir.types import DType

CHEAP = 24  # lambda cost (see place._cost_expr) up to which recomputing a map beats storing it


@dataclass(frozen=True)
class Array:
    """An array value: an input (grad, state, payload field, decode output) or an op result."""

    name: str
    dtype: DType
    length: ir.Expr
    bits: int | None
    origin: str  # "grad" | "state" | "payload" | "map" | "op"


@dataclass(frozen=True)
class Destination:
    """Where stored values go: ``ws`` (workspace array ``name``), ``state``, ``payload`` (field
    ``name``), ``out`` (decode output) or ``outacc`` (decode output, accumulated)."""

    kind: str
    name: str


@dataclass(frozen=True)
class Item:
    """One unit of a fused loop: ``reduce`` (op is a Reduce) or ``store`` (op is a Map whose
    values go to ``targets``)."""

    kind: str
    op: ir.Reduce | ir.Map
    targets: tuple[Destination, ...] = ()
    copy: bool = False  # a copy of a stored array: read it from memory, never recompute


@dataclass(frozen=True)
class Loop:
    """Loop items of one level and one length, run as one parallel loop."""

    level: int
    length: ir.Expr
    items: tuple[Item, ...] = ()


@dataclass(frozen=True)
class ScatterAdd:
    """The sequential part of a scatter: ``home[idx[j]] += vals[j]`` (the init is a loop item)."""

    op: ir.Scatter


@dataclass(frozen=True)
class Special:
    """A stage of its own: Filter, TopK, Sort, Scan, SegReduce, ScatterAdd or a custom Reduce."""

    level: int
    op: ir.Filter | ir.TopK | ir.Sort | ir.Scan | ir.SegReduce | ScatterAdd | ir.Reduce
    home: Destination | None


@dataclass(frozen=True)
class Step:
    """Everything of one level: independent loops and specials, then host lets."""

    level: int
    loops: tuple[Loop, ...] = ()
    specials: tuple[Special, ...] = ()
    lets: tuple[ir.Let, ...] = ()


@dataclass(frozen=True)
class SegFusion:
    """A segment reduction (the only special of its level, ``level``) run block by block of
    whole segments together with the loops that consume it (C target; see hipress/compll/lower/fuse.py):
    per block, the segments are reduced, then ``seg_loops`` (one iteration per segment) run over
    the block's segments and ``elem_loops`` (as long as the reduction) over its elements, while
    they are in cache. The fused loops stay in ``KernelPlan.steps`` too (other targets run them
    unfused); ``seg`` is the constant segment length (>= 1)."""

    level: int
    special: Special
    seg: int
    seg_loops: tuple[Loop, ...]
    elem_loops: tuple[Loop, ...]


@dataclass(frozen=True)
class FilterFusion:
    """A filter (``special``, at ``level``) whose pass can also compute and store the maps of
    ``loop`` (deferred to it; the loop is at the same level and holds nothing else). The filter
    reads the first of them at ``index``, an expression of its parameter ``param``: ``param``
    itself, or ``(param + offset) % length``; every one of them is elementwise, so the pass
    computes each at that index and stores it there. With ``offset``, the indices cover the
    whole length once only when ``0 <= offset < length``, which a target checks at run time (it
    runs the loop, then the plain filter, otherwise)."""

    level: int
    special: Special
    loop: Loop
    index: ir.Expr
    param: str
    offset: ir.Expr | None


@dataclass(frozen=True)
class KernelPlan:
    """The executable structure of encode or decode.

    ``homes`` maps every stored array to its target (virtual maps are absent); ``levels`` gives
    the level of each stored array / reduction; ``ws`` lists workspace arrays in layout order.
    ``final_state`` are scalar state stores done at the very end (encode only). ``deferred``
    are the maps stored at their filter's level (:class:`FilterFusion`): read before that
    level, they are recomputed.
    """

    fn: str  # "encode" | "decode"
    arrays: Mapping[str, Array]
    maps: Mapping[str, ir.Map]
    homes: Mapping[str, Destination]
    levels: Mapping[str, int]
    steps: tuple[Step, ...]
    ws: tuple[Array, ...]
    final_state: tuple[ir.StoreState, ...]
    cost: Mapping[str, int]
    accumulate: bool = False
    fusions: tuple[SegFusion, ...] = ()
    deferred: frozenset[str] = frozenset()
    filter_fusions: tuple[FilterFusion, ...] = ()
    nonfinite: str | None = (
        None  # the gradient's NaN/Inf reduction (hipress/compll/lower/finite.py)
    )
    nonfinite_stage: Special | None = None  # ... computed by this stage's fused pass, if set

    def is_virtual(self, name: str) -> bool:
        return name in self.maps and name not in self.homes

    def inline_read(self, name: str, level: int, aligned: bool) -> bool:
        """Whether a loop item at ``level`` reads array ``name`` by recomputing its map."""
        return inline(self, name, level, aligned)

    def recomputed(self, name: str, level: int) -> bool:
        """Whether any reader at ``level`` (loop item, stage or host code) must recompute
        ``name``: a deferred map read before its filter's level."""
        return name in self.deferred and level < self.levels[name]


class Planning(Protocol):
    """What :func:`inline` needs: a :class:`KernelPlan`, or the planner's placement it is built from."""

    @property
    def maps(self) -> Mapping[str, ir.Map]: ...

    @property
    def levels(self) -> Mapping[str, int]: ...

    @property
    def cost(self) -> Mapping[str, int]: ...

    @property
    def deferred(self) -> Collection[str]: ...

    def is_virtual(self, name: str) -> bool: ...


def inline(p: Planning, name: str, level: int, aligned: bool) -> bool:
    """The rule of :meth:`KernelPlan.inline_read`, for the plan and for the planner building it."""
    if p.is_virtual(name):
        return True
    if name not in p.maps or name not in p.levels:
        return False
    lv = p.levels[name]
    if name in p.deferred:  # stored in place at lv: its inputs are overwritten from then on
        return level < lv or (level == lv and aligned)
    if not aligned:
        return False
    return lv == level or (lv < level and p.cost[name] <= CHEAP)


K = TypeVar("K")
V = TypeVar("V")


def frozen(d: Mapping[K, V]) -> Mapping[K, V]:
    """A read-only copy of ``d`` (same order)."""
    return MappingProxyType(dict(d))


def replace_loop(plan: KernelPlan, old: Loop, new: Loop) -> KernelPlan:
    """``plan`` with loop ``old`` (by identity) replaced by ``new`` in its steps and in the
    fusions that run it."""

    def sub(lp: Loop) -> Loop:
        return new if lp is old else lp

    steps = tuple(replace(st, loops=tuple(sub(lp) for lp in st.loops)) for st in plan.steps)
    fusions = tuple(
        replace(
            f,
            seg_loops=tuple(sub(lp) for lp in f.seg_loops),
            elem_loops=tuple(sub(lp) for lp in f.elem_loops),
        )
        for f in plan.fusions
    )
    ffs = tuple(replace(f, loop=sub(f.loop)) for f in plan.filter_fusions)
    return replace(plan, steps=steps, fusions=fusions, filter_fusions=ffs)
