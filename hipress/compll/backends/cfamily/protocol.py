"""One function being rendered, as a target's stage rules see it: what every C-family target's
function has (:class:`~hipress.compll.backends.cfamily.family.CFamily`). A target's stage
rules extend it with that target's own methods (:mod:`hipress.compll.backends.c.stages`,
:mod:`hipress.compll.backends.cuda.stages`), so that they name the renderer they are called
by without importing it."""

from __future__ import annotations

from typing import Protocol

import jinja2

from hipress.compll.backends.cfamily.expr import Emitter
from hipress.compll.backends.cfamily.syntax import Names
from hipress.compll.ir import nodes as ir
from hipress.compll.lower.kernel_plan import Destination, KernelPlan


class FamilyRenderer(Protocol):
    """The state and helpers of :class:`~hipress.compll.backends.cfamily.family.CFamily` that
    stage rules use."""

    env: jinja2.Environment
    prog: ir.Program
    plan: KernelPlan
    names: Names
    em: Emitter
    hoisted: list[str]
    ws: list[str]
    ws_ptr: dict[str, str]

    def length(self, e: ir.Expr) -> str: ...

    def target_ptr(self, t: Destination) -> str: ...

    def scratch(self, ctype_: str, count: str, size: object = None) -> str: ...

    def lambda_body(
        self, fn: ir.Lambda, length: ir.Expr | None, level: int, idx: str = "j"
    ) -> tuple[list[str], str]: ...

    def custom_reduce(self, op: ir.Reduce, lv: int, shown_level: int) -> str: ...


__all__ = ["FamilyRenderer"]
