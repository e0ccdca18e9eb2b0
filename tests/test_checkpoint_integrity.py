"""CaSync checkpoint integrity: the digest, non-finite state, checkpoints saved before digests,
and another algorithm's checkpoint (a message that names both algorithms, whose advice works)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from dist_utils import run_workers
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from hipress.casync import CaSyncError, register
from hipress.codec.integrity import digest, seal, verify
from hipress.core.plan import Plan, Strategy, TensorPlan


def test_digest_tells_values_dtypes_and_shapes_apart() -> None:
    base = {"a": torch.zeros(4), "b": [1, "x", None], "c": {"d": 1.5}}
    same = {"c": {"d": 1.5}, "b": [1, "x", None], "a": torch.zeros(4)}
    assert digest(base) == digest(same)  # (key order does not count)
    for other in (
        {**base, "a": torch.zeros(4, dtype=torch.float64)},
        {**base, "a": torch.zeros(2, 2)},
        {**base, "a": torch.tensor([0.0, 0.0, 0.0, -0.0])},
        {**base, "b": [1, "x", 0]},
        {**base, "c": {"d": 1}},
        {**base, "b": [True, "x", None]},
    ):
        assert digest(other) != digest(base)


def test_a_sealed_dict_verifies_and_an_edited_one_does_not() -> None:
    sd = seal({"format": "f", "worker": {"k": {"tensors": {"comp": torch.ones(3)}}}})
    assert verify(sd, "rank 0", ValueError)
    sd["worker"]["k"]["tensors"]["comp"][1] = 2.0
    with pytest.raises(ValueError, match=r"rank 0: damaged checkpoint: .* does not match"):
        verify(sd, "rank 0", ValueError)
    renamed = {("digesu" if k == "digest" else k): v for k, v in seal(dict(sd)).items()}
    with pytest.raises(ValueError, match="no digest, but entries an unsealed one"):
        verify(renamed, "rank 0", ValueError)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 96), nn.ReLU(), nn.Linear(96, 4))


def _state(algorithm: str, train: bool = False, **params: Any) -> Any:
    how = {"0.weight": Strategy.PS, "2.weight": Strategy.ALLGATHER}
    entries = tuple(
        TensorPlan(n, p.numel(), n in how, how.get(n, Strategy.ALLREDUCE))
        for n, p in _model().named_parameters()
    )
    ddp = DDP(_model())
    plan = Plan(algorithm, params, 1, entries)
    state = register(ddp, algorithm, params=params, plan=plan, log_every=0)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for step in range(2 if train else 0):
        opt.zero_grad()
        gen = torch.Generator().manual_seed(step)
        nn.functional.mse_loss(ddp(torch.randn(8, 16, generator=gen)), torch.zeros(8, 4)).backward()
        opt.step()
    return state


def _checks(rank: int, world_size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    topk = _state("topk", train=True, ratio=0.01).state_dict()  # (the default ratio)
    onebit = _state("onebit")
    with pytest.raises(CaSyncError) as info:
        onebit.load_state_dict(topk)
    out["algorithm"] = str(info.value)
    _state("topk", ratio=0.01).load_state_dict(topk)  # (what the message says to do)
    with pytest.raises(CaSyncError) as info:
        _state("topk", ratio=0.1).load_state_dict(topk)
    out["params"] = str(info.value)
    # non-finite: refused, the state untouched; exempt where the lost flag drops it
    sd = onebit.state_dict()
    before = digest(sd)
    key = "2.weight#0/1"
    sd["worker"][key]["tensors"]["comp"][3] = float("nan")
    with pytest.raises(CaSyncError) as info:
        onebit.load_state_dict(seal(sd))
    out["nan"] = str(info.value)
    out["untouched"] = digest(onebit.state_dict()) == before
    sd["worker"][key]["tensors"]["lost"].fill_(True)
    onebit.load_state_dict(seal(sd))  # (its next step drops the residual)
    # saved before digests: loads, with a warning
    old = {k: v for k, v in onebit.state_dict().items() if k not in ("digest", "version")}
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(r.getMessage())  # type: ignore[method-assign]
    logging.getLogger("hipress.codec.integrity").addHandler(handler)
    onebit.load_state_dict(old)
    out["old"] = records
    return out


def test_algorithm_non_finite_and_unsealed_checkpoints() -> None:
    got = run_workers(_checks, 1)[0]
    msg = got["algorithm"]
    assert "saved with another algorithm: topk {'ratio': 0.01}, this state runs onebit" in msg
    assert "register with algorithm='topk', params={'ratio': 0.01}" in msg
    assert "other parameters (ratio): topk {'ratio': 0.01}, this state runs topk {'ratio': 0.1}" in got["params"]
    assert "state `2.weight#0/1` entry `comp` holds 1 non-finite value(s)" in got["nan"]
    assert got["untouched"]
    assert any("loaded unverified" in r for r in got["old"])
