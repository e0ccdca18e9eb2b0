"""hipress.fsdp error feedback saved through torch.distributed.checkpoint at N real gloo ranks
loads at M, 2 -> 4 and 4 -> 2, keeping for every gradient element of every unit the sum over
ranks of the residuals (what the next compressed reduce-scatter adds there). The sums are read
back from each rank's saved entry and mapped from FSDP2's padded rows to the parameters by a
formula written here, apart from hipress's own mapping."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from dist_utils import run_workers
from fsdp_workers import shard
from torch import nn

import hipress.fsdp
from hipress.codec.residual import mass_of
from hipress.fsdp import FsdpError
from hipress.fsdp.state import _SEALED

PRELOAD = ("torch", "torch.distributed", "torch.distributed.fsdp", "hipress.fsdp", "fsdp_workers")
# (algorithm, feedback): an algorithm's own state in bfloat16, a threshold state in float32,
# an external int8 residual
CONFIGS = [("onebit", "bf16"), ("topk", "fp32"), ("terngrad", "int8")]
# dim 0 of 6 and 5 pads differently at 2 ranks (6, 6) and at 4 (8, 8)
SHAPES = {"0": [(6, 5), (6,)], "2": [(5, 6), (5,)]}


def _register(alg: str, feedback: str) -> tuple[nn.Module, Any]:
    torch.manual_seed(0)
    model = shard(nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 5)))
    params = {"ratio": 0.3} if alg == "topk" else None
    return model, hipress.fsdp.register(model, alg, params, feedback=feedback,
                                        min_compress_numel=1, plan={"0": True, "2": True})  # fmt: skip


def _steps(model: nn.Module, n: int, seed: int) -> None:
    for i in range(n):
        g = torch.Generator().manual_seed(100 * seed + 10 * dist.get_rank() + i)
        model(torch.randn(3, 5, generator=g)).square().sum().backward()


def phase(rank: int, world_size: int, load_from: str | None, save_to: str) -> dict[str, Any]:
    """Per config: load the checkpoints under ``load_from`` (if any; the entry as loaded),
    train 2 steps and save under ``save_to`` (the entry as saved)."""
    out: dict[str, Any] = {}
    for alg, fb in CONFIGS:
        model, comp = _register(alg, fb)
        if load_from is not None:
            dcp.load({"hipress": comp}, checkpoint_id=f"{load_from}/{alg}-{fb}")
            out[f"{alg}-{fb}-loaded"] = comp.state_dict()[f"rank{rank}"]
            out[f"{alg}-{fb}-step"] = comp.units["0"].coders[0].state.step
        _steps(model, 2, world_size)
        dcp.save({"hipress": comp}, checkpoint_id=f"{save_to}/{alg}-{fb}")
        out[f"{alg}-{fb}-saved"] = comp.state_dict()[f"rank{rank}"]
    if load_from is not None:  # a checkpoint that does not fit: refused on every rank
        sd = comp.state_dict()
        before = sd[f"rank{rank}"]
        try:
            comp.load_state_dict({**sd, "world_size": world_size - 1})
            out["short"] = "loaded"
        except FsdpError as exc:
            out["short"] = str(exc)
        out["untouched"] = comp.state_dict()[f"rank{rank}"] == before
    return out


def _masses(blob: bytes, alg: str, params: dict[str, Any]) -> dict[str, list[torch.Tensor]]:
    """unit -> the rows' masses (chunk order) of one rank's sealed entry."""
    entry = torch.load(io.BytesIO(blob[len(_SEALED) + 32 :]), weights_only=True)
    out = {}
    for unit, states in entry.items():
        rows = []
        for j in range(len(states["chunks"])):
            c = states["chunks"][str(j)]
            if "residual" in c:  # an external residual
                r = c["residual"]
                if "q" in r:  # int8, a scale per block of 256
                    v = (r["q"].view(-1, 256).float() * r["scale"][:, None]).view(-1)
                else:
                    v = r["e"].float()
                rows.append(v[: c["alg"]["n"]])
            else:
                rows.append(mass_of(alg, params, c["alg"]["tensors"])["residual"])
        out[unit] = rows
    return out


def _to_params(
    rows: list[torch.Tensor], shapes: list[tuple[int, ...]], padded: bool
) -> torch.Tensor:
    """FSDP2's rows (row j: every parameter's dim-0 chunk j, padded) as the parameters'
    elements, flattened one after another; unless ``padded``, checks that the padding holds
    nothing (a resharded state starts its padding at zero)."""
    n = len(rows)
    parts, offset = [], 0
    for shape in shapes:
        d, s = shape[0], (shape[1] if len(shape) > 1 else 1)
        c = -(-d // n)
        full = torch.cat([row[offset : offset + c * s] for row in rows])
        assert padded or not full[d * s :].any(), "mass in padding"
        parts.append(full[: d * s])
        offset += c * s
    return torch.cat(parts).double()


def _sums(results: list[dict[str, Any]], key: str, alg: str) -> dict[str, list[torch.Tensor]]:
    """unit -> each rank's residual over the unit's parameters."""
    params = {"ratio": 0.3} if alg == "topk" else {}
    per_rank = [_masses(r[key], alg, params) for r in results]
    padded = key.endswith("-saved")  # (encoding zero padding leaves a residual there)
    return {u: [_to_params(m[u], SHAPES[u], padded) for m in per_rank] for u in SHAPES}


def _check(saved: list[dict[str, Any]], loaded: list[dict[str, Any]], step: int) -> None:
    m = len(loaded)
    for alg, fb in CONFIGS:
        before = _sums(saved, f"{alg}-{fb}-saved", alg)
        after = _sums(loaded, f"{alg}-{fb}-loaded", alg)
        tol = {"fp32": 1e-6, "bf16": 8e-3, "int8": 2e-2}[fb]
        for unit in SHAPES:
            total = torch.stack(before[unit]).sum(0)
            assert total.abs().max() > 0.01, (alg, fb, unit)
            scale = total.abs().max().item()
            got = torch.stack(after[unit]).sum(0)
            assert (got - total).abs().max().item() <= tol * scale, (alg, fb, unit)
            for share in after[unit]:  # every rank holds an equal share
                assert (share - total / m).abs().max().item() <= tol * scale, (alg, fb, unit)
        assert all(r[f"{alg}-{fb}-step"] == step for r in loaded), alg  # kept by every state


def test_fsdp_error_feedback_reshards_2_to_4_and_4_to_2(tmp_path: Path) -> None:
    a, b, c = (str(tmp_path / d) for d in "abc")
    at2 = run_workers(phase, 2, None, a, preload=PRELOAD, timeout=300)
    at4 = run_workers(phase, 4, a, b, preload=PRELOAD, timeout=300)
    _check(at2, at4, 2)
    back = run_workers(phase, 2, b, c, preload=PRELOAD, timeout=300)
    _check(at4, back, 4)
    for got in (at4, back):  # (a rank of the last holds no entry: it hears of the others')
        assert all(r["untouched"] is True for r in got)
        assert all("does not hold" in r["short"] for r in got[:-1]), got[0]["short"]
        assert "another rank refused" in got[-1]["short"], got[-1]["short"]
