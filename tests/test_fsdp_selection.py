"""Which FSDP units may be compressed (:mod:`hipress.fsdp.selection`): a unit holding an
embedding weight stays plain under the default and ``"auto"`` plans, ``exclude=`` keeps a
unit plain, ``include=`` and explicit plans may compress it (with a warning); real 2-process
gloo runs of ``fully_shard`` models."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from dist_utils import run_workers
from torch import nn
from torch.distributed.fsdp import fully_shard

import hipress.fsdp
from hipress.fsdp import FsdpError
from hipress.secopa.model.profile import affine_profile

PRELOAD = ("torch", "torch.distributed", "torch.distributed.fsdp", "hipress.fsdp")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(512, 256)
        self.blocks = nn.Sequential(nn.Linear(256, 512), nn.Linear(512, 256))
        self.norm = nn.LayerNorm(256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.blocks(self.tok(x))).square().mean()


def _model() -> Net:
    torch.manual_seed(0)
    model = Net()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)  # "<root>": the embedding and the norm
    return model


def _slow_link() -> Any:
    """onebit's costs over a 10 Mbit/s link: every unit of this model wins compressed."""
    return affine_profile(
        "onebit", encode=(1e-6, 0.01, 0.0), decode=(1e-6, 0.01, 0.0), merge=(5e-7, 0.01, 0.0),
        bytes_per_element=1 / 8, bandwidth_bytes_per_s=1.25e6, latency_s=1e-3,
    )  # fmt: skip


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _units(rank: int, world_size: int) -> dict[str, Any]:
    lines = _Lines()
    logging.getLogger("hipress.fsdp.selection").addHandler(lines)
    out: dict[str, Any] = {}
    for name, kwargs in {
        "default": {},
        "exclude": {"exclude": "blocks.1.*"},
        "include": {"include": "tok.*"},
        "mapping": {"plan": {"<root>": True}},
        "auto": {"plan": "auto", "profile": _slow_link()},
    }.items():
        before = len(lines.lines)
        comp = hipress.fsdp.register(_model(), "onebit", **kwargs)
        units = comp.plan.units
        out[name] = ({k: u.compress for k, u in units.items()},
                     {k: u.source for k, u in units.items()}, len(lines.lines) - before)  # fmt: skip
    try:
        hipress.fsdp.register(_model(), "onebit", shapes="vectors")
    except FsdpError as exc:
        out["error"] = str(exc)
    try:  # a misspelt name: refused on every rank, not a silently plain embedding
        hipress.fsdp.register(_model(), "onebit", include="tok.weigth")
    except FsdpError as exc:
        out["typo"] = str(exc)
    return out


def test_units_kept_plain_on_two_ranks() -> None:
    for got in run_workers(_units, 2, preload=PRELOAD, timeout=180.0):
        on, source, warned = got["default"]
        assert on == {"blocks.0": True, "blocks.1": True, "<root>": False} and warned == 0
        assert source["<root>"] == "plain: tok.weight: embedding"
        on, source, _ = got["exclude"]
        assert on == {"blocks.0": True, "blocks.1": False, "<root>": False}
        assert source["blocks.1"] == "plain: blocks.1.weight: excluded by 'blocks.1.*'"
        assert got["include"][0]["<root>"] and got["include"][2] == 1  # compressed, warned
        assert got["mapping"][0]["<root>"] and got["mapping"][2] == 1
        on, source, warned = got["auto"]
        assert on == {"blocks.0": True, "blocks.1": True, "<root>": False} and warned == 0
        assert "shapes" in got["error"]
        assert "include='tok.weigth' matches no parameter" in got["typo"]
        assert "did you mean 'tok.weight'" in got["typo"]


@pytest.mark.parametrize("bad", [{"include": 7}, {"exclude": ["ok", ""]}])
def test_bad_patterns_name_the_argument(bad: dict[str, Any]) -> None:
    from hipress.fsdp.register import _selection

    with pytest.raises(FsdpError, match=next(iter(bad))):
        _selection(Net(), bad.get("include"), bad.get("exclude"), "all")
