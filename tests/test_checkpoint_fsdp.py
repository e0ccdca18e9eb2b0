"""hipress.fsdp checkpoints through torch.distributed.checkpoint on real gloo ranks: a flipped
bit in a rank's entry and a NaN in a saved state are refused with an FsdpError naming the entry
and the reason, and nothing is restored (another algorithm's checkpoint: test_fsdp_checks)."""

from __future__ import annotations

import hashlib
import io
import os
import random
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from dist_utils import run_workers
from fsdp_workers import shard
from torch import nn

import hipress.fsdp
from hipress.fsdp import FsdpError
from hipress.fsdp.state import _SEALED

EXAMPLES = int(os.environ.get("HIPRESS_FUZZ_EXAMPLES", "0")) or 48
PRELOAD = ("torch", "torch.distributed", "torch.distributed.fsdp", "hipress.fsdp", "fsdp_workers")


def _registered() -> Any:
    torch.manual_seed(0)
    model = shard(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)))
    comp = hipress.fsdp.register(model, "onebit", min_compress_numel=1)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(dist.get_rank()))
    model(x).square().sum().backward()  # every compressed unit holds a residual now
    return comp


def _error(fn: Any) -> str:
    try:
        fn()
    except FsdpError as exc:
        return str(exc)
    except BaseException as exc:  # (torch's CheckpointException is a BaseException)
        return f"not an FsdpError: {type(exc).__name__}: {exc}"
    return "loaded"


def _with_nan(blob: bytes) -> bytes:
    head = len(_SEALED) + 32
    mine = torch.load(io.BytesIO(blob[head:]), weights_only=True)
    unit = sorted(mine)[0]
    mine[unit]["chunks"]["0"]["alg"]["tensors"]["comp"][0] = float("nan")
    buf = io.BytesIO()
    torch.save(mine, buf)
    return _SEALED + hashlib.sha256(buf.getvalue()).digest() + buf.getvalue()


def _tampered(rank: int, world_size: int, root: str) -> dict[str, str]:
    comp = _registered()
    dcp.save({"hipress": comp}, checkpoint_id=f"{root}/ckpt")
    before = comp.state_dict()[f"rank{rank}"]
    out = {}
    sd = comp.state_dict()
    sd[f"rank{rank}"] = _with_nan(sd[f"rank{rank}"])
    out["nan"] = _error(lambda: comp.load_state_dict(sd))
    rng, fuzzed = random.Random(rank), []
    for i in range(EXAMPLES):  # random bit flips and truncations of this rank's entry
        blob = bytearray(before)
        at = rng.randrange(len(blob))
        if i % 2:
            blob[at] ^= 1 << rng.randrange(8)
        else:
            del blob[at:]
        msg = _error(lambda b=bytes(blob): comp.load_state_dict({**sd, f"rank{rank}": b}))
        if f"entry rank{rank}" not in msg and "no matching entry" not in msg:
            fuzzed.append(f"#{i} at {at}: {msg}")
    out["fuzzed"] = "; ".join(fuzzed[:3])
    dist.barrier()
    if rank == 0:  # one flipped bit inside rank 1's sealed entry
        for f in sorted(Path(f"{root}/ckpt").glob("*.distcp")):
            data = bytearray(f.read_bytes())
            at = data.find(_SEALED)
            while at >= 0 and len(data) - at < 200:
                at = data.find(_SEALED, at + 1)
            if at >= 0 and f.name.startswith("__1"):
                data[at + len(_SEALED) + 32 + random.Random(0).randrange(100)] ^= 4
                f.write_bytes(bytes(data))
    dist.barrier()
    out["flip"] = _error(lambda: dcp.load({"hipress": comp}, checkpoint_id=f"{root}/ckpt"))
    out["untouched"] = str(comp.state_dict()[f"rank{rank}"] == before)
    return out


def test_damaged_and_non_finite_fsdp_checkpoints_are_refused(tmp_path: Path) -> None:
    got = run_workers(_tampered, 2, str(tmp_path), preload=PRELOAD, timeout=180)
    for out in got:
        assert "the checkpoint's entry rank" in out["nan"] and "non-finite" in out["nan"], out
        assert out["untouched"] == "True"
        assert out["fuzzed"] == ""
    assert got[0]["flip"] == "loaded"
    assert "entry rank1 is damaged: its bytes do not match the digest" in got[1]["flip"], got[1]
