"""register(..., rows=...): which gradients may travel as rows (hipress.casync.rowsel)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from hipress.casync import register
from hipress.casync.rowsel import RowSelect
from hipress.codec.errors import CaSyncError

SHAPES = {"0.weight": (1000, 8), "2.weight": (4, 16), "2.bias": (4,)}


@pytest.mark.parametrize(("rows", "match"), [
    ("some", "rows must be 'auto', 'none', 'exact' or a list"),
    (3, "rows must be .* got int"),
    (["nope"], r"no parameter with a gradient is named \['nope'\]"),
    (["2.bias"], r"only 2-D parameters travel as rows, not \['2.bias'\]"),
    ([1], "parameter names are strings, got 1"),
])  # fmt: skip
def test_bad_rows_values_are_named(rows: Any, match: str) -> None:
    with pytest.raises(CaSyncError, match=match):
        RowSelect.of(rows, None, False, SHAPES)


def test_exact_and_names_need_a_plan_the_probe_may_change() -> None:
    with pytest.raises(CaSyncError, match="not supported with a plan given explicitly"):
        RowSelect.of("exact", "plan.json", False, SHAPES)
    with pytest.raises(CaSyncError, match="not supported with a multi-round algorithm"):
        RowSelect.of(["0.weight"], "auto", True, SHAPES)
    assert RowSelect.of("none", "plan.json", False, SHAPES).never


@pytest.fixture
def one_rank(tmp_path: Path) -> Iterator[None]:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0,
                            world_size=1)  # fmt: skip
    yield
    dist.destroy_process_group()


def _rows_after(rows: Any, used: int) -> dict[str, int]:
    """Three steps of a model whose embedding (1000 rows) sees ``used`` tokens: the row
    bound of each entry the plan runs as rows."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(1000, 8), nn.Flatten(), nn.Linear(16, 4))
    ddp = DistributedDataParallel(model)
    state = register(ddp, "onebit", rows=rows)
    for _ in range(3):
        ddp(torch.arange(600).remainder(used).view(300, 2)).sum().backward()
    return {e.name: e.row_bound for e in state.plan.entries if e.row_bound}


@pytest.mark.usefixtures("one_rank")
def test_rows_none_auto_exact_and_names() -> None:
    # 300 of 1000 rows touched: a bound of 601 rows, over the quarter the default rule allows
    assert _rows_after("auto", 300) == {}
    assert _rows_after("exact", 300) == {"0.weight": 601}  # sparse at all: exact rows
    assert _rows_after(["0.weight"], 300) == {"0.weight": 601}
    assert _rows_after("auto", 10) == {"0.weight": 21}
    assert _rows_after("none", 10) == {}
