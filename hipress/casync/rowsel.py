"""Which gradients may travel as rows: ``register(..., rows=...)`` (:class:`RowSelect`).

- ``"auto"`` (the default): the embeddings the default rule or ``plan="auto"`` keeps plain
  travel as exact rows where rows pay (:mod:`hipress.casync.rowprobe`: SeCoPa's break-even
  count, else a quarter of the rows).
- ``"none"``: never as rows; every gradient runs as the plan says.
- ``"exact"``: those embeddings travel as exact rows wherever the first count sees them
  sparse (each rank's bound, twice its touched rows plus one, below the row count), whatever
  the prices say.
- a list or set of parameter names (2-D parameters): those, and only those, travel as exact
  rows wherever the count sees them sparse; a name the plan would compress is run plain until
  then (rows are exact).

The row count and the decision are the row probe's; this only chooses what it considers
and by which count it decides (``plan.meta["row_prices"][name]["breakeven"]``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from hipress.codec.errors import CaSyncError
from hipress.codec.rowplan import candidates
from hipress.core.plan import Plan, Strategy

__all__ = ["ROW_WORDS", "RowSelect"]

ROW_WORDS = ("auto", "none", "exact")


@dataclasses.dataclass(frozen=True)
class RowSelect:
    """A state's ``rows=`` (module docstring): ``mode`` is one of :data:`ROW_WORDS` or
    ``"names"`` (then ``names`` holds them)."""

    mode: str = "auto"
    names: frozenset[str] = frozenset()

    @classmethod
    def of(cls, rows: Any, plan_arg: Any, multi: bool,
           shapes: Mapping[str, tuple[int, ...] | None]) -> RowSelect:  # fmt: skip
        """Check ``rows`` against the state's plan argument, algorithm and parameter shapes;
        raise :class:`CaSyncError` naming what is wrong."""
        if isinstance(rows, str):
            if rows not in ROW_WORDS:
                raise CaSyncError(f"rows must be 'auto', 'none', 'exact' or a list of parameter "
                                  f"names, got {rows!r}")  # fmt: skip
            sel = cls(rows)
        elif isinstance(rows, (list, tuple, set, frozenset)):
            bad = [n for n in rows if not isinstance(n, str)]
            if bad:
                raise CaSyncError(f"rows: parameter names are strings, got {bad[0]!r}")
            unknown = sorted(set(rows) - set(shapes))
            if unknown:
                raise CaSyncError(f"rows: no parameter with a gradient is named {unknown[:5]} "
                                  f"(names as model.module.named_parameters() gives them)")  # fmt: skip
            flat = sorted(n for n in rows if (s := shapes[n]) is not None and len(s) != 2)
            if flat:
                raise CaSyncError(f"rows: only 2-D parameters travel as rows, not {flat[:5]}")
            sel = cls("names", frozenset(rows))
        else:
            raise CaSyncError(f"rows must be 'auto', 'none', 'exact' or a list of parameter "
                              f"names, got {type(rows).__name__}")  # fmt: skip
        implicit = plan_arg is None or (isinstance(plan_arg, str) and plan_arg in ("default",
                                                                                    "auto"))  # fmt: skip
        if sel.mode in ("exact", "names") and (multi or not implicit):
            what = "a multi-round algorithm" if multi else "a plan given explicitly"
            raise CaSyncError(f"rows={rows!r} is not supported with {what}: use rows='auto' or "
                              "'none' (an explicit plan runs as it is)")  # fmt: skip
        return sel

    @property
    def never(self) -> bool:
        """Whether no gradient travels as rows."""
        return self.mode == "none"

    def prepare(self, plan: Plan, shapes: Mapping[str, tuple[int, ...] | None],
                probe: Any) -> Plan:  # fmt: skip
        """``plan`` made ready for the row decision this selection asks for: the names run
        plain and are the probe's candidates, and each candidate's break-even count is "sparse
        at all" (``"exact"``, names); ``plan`` itself otherwise."""
        if self.mode not in ("exact", "names"):
            return plan
        if self.mode == "names":
            rows = {n: int(s[0]) for n, s in shapes.items() if n in self.names and s}
            entries = tuple(
                dataclasses.replace(e, compress=False, strategy=Strategy.ALLREDUCE, partitions=1)
                if e.name in rows and not e.row_bound else e
                for e in plan.entries
            )  # fmt: skip
            plan = dataclasses.replace(plan, entries=entries)
        else:
            rows = candidates(plan, shapes)
        probe.rows = rows
        prices = {n: dict(v) for n, v in dict(plan.meta.get("row_prices") or {}).items()}
        for name, n in rows.items():  # sparse: the bound 2 * touched + 1 below the rows
            prices[name] = {**prices.get(name, {}), "rows": n, "breakeven": max(-1, (n - 2) // 2),
                            "objective": f"rows={self.mode}"}  # fmt: skip
        return dataclasses.replace(plan, meta={**plan.meta, "row_prices": prices})
