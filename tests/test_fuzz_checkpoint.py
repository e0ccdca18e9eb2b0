"""Fuzzing CaSync checkpoints: tampered files are refused with a CaSyncError, all or nothing.

Real gloo ranks save their state (one file per rank, and the gathered file rank 0 writes); a
1-rank run saves another world size's. Each rank then loads, from seeded random tampering:

- bit flips at random offsets of its own file and of the gathered file,
- truncation at random offsets,
- foreign files: the other rank's, the other world size's, a random ``torch.save`` of
  something else (tensors, lists, dicts that claim the CaSync format, gathered forms of
  nonsense),
- non-finite tensors: a NaN or an infinity written into a state, the file re-sealed (its
  digest then matches: only the finiteness check can refuse it).

Every one must raise :class:`CaSyncError` from ``hipress.casync.persist.read`` or
``load_state_dict`` and leave the state as it was; a flip that torch does not see (padding, a
record it does not read) must load content identical to what was saved. 0 accepted.

The example count per rank is HIPRESS_FUZZ_EXAMPLES (default 48, a few seconds)::

    HIPRESS_FUZZ_EXAMPLES=2000 .venv/bin/python -m pytest -q tests/test_fuzz_checkpoint.py
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from dist_utils import run_workers
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from hipress.casync import CaSyncError, register
from hipress.casync.persist import read
from hipress.codec.integrity import digest, seal
from hipress.core.plan import Plan, Strategy, TensorPlan

EXAMPLES = int(os.environ.get("HIPRESS_FUZZ_EXAMPLES", "0")) or 48
KINDS = ("flip", "flip-gathered", "truncate", "foreign", "nonfinite")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 96), nn.ReLU(), nn.Linear(96, 4))


def _plan(world_size: int) -> Plan:
    how = {"0.weight": Strategy.PS, "2.weight": Strategy.ALLGATHER}
    entries = tuple(
        TensorPlan(n, p.numel(), n in how, how.get(n, Strategy.ALLREDUCE))
        for n, p in _model().named_parameters()
    )
    return Plan("onebit", {}, world_size, entries)


def _trained(rank: int, world_size: int) -> Any:
    ddp = DDP(_model())
    state = register(ddp, "onebit", plan=_plan(world_size), log_every=0)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for step in range(2):
        gen = torch.Generator().manual_seed(100 * step + rank)
        opt.zero_grad()
        nn.functional.mse_loss(ddp(torch.randn(8, 16, generator=gen)), torch.zeros(8, 4)).backward()
        opt.step()
    return state


def _save_one(rank: int, world_size: int, out: str) -> None:
    torch.save(_trained(rank, world_size).state_dict(), out)


def _nonfinite(sd: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """``sd`` (one rank's) with a NaN or infinity in one state, re-sealed."""
    states = [s for part in ("worker", "server") for s in sd[part].values()]
    st = rng.choice(states)
    name = rng.choice([k for k, t in st["tensors"].items() if t.is_floating_point()])
    t = st["tensors"][name]
    t.view(-1)[rng.randrange(t.numel())] = rng.choice([float("nan"), float("inf"), -float("inf")])
    if "lost" in st["tensors"]:
        st["tensors"]["lost"].fill_(False)
    return seal(sd)


def _foreign(rng: random.Random, other: bytes, w1: bytes, rank: int) -> Any:
    """Something that is not this rank's checkpoint."""
    pick = rng.randrange(7)
    if pick == 0:
        return ("bytes", other)  # the other rank's file
    if pick == 1:
        return ("bytes", w1)  # another world size's
    junk = [
        torch.randn(rng.randrange(1, 50)),
        [rng.randrange(-5, 5) for _ in range(rng.randrange(5))],
        {"format": "hipress.casync/1", "rank": rank, "world_size": 2, "step": rng.randrange(-3, 3)},
        {"format": "hipress.casync.gathered/1", "world_size": 2, "ranks": [None, {"x": 1}]},
        {"format": "hipress.casync.gathered/1", "world_size": rng.randrange(5), "ranks": "x"},
        _model().state_dict(),
    ]
    return ("object", rng.choice(junk))


def _tampered(kind: str, rng: random.Random, files: dict[str, bytes], rank: int) -> bytes | Any:
    if kind in ("flip", "flip-gathered", "truncate"):
        data = bytearray(files["gathered" if kind == "flip-gathered" else "own"])
        at = rng.randrange(len(data))
        if kind == "truncate":
            return bytes(data[:at])
        data[at] ^= 1 << rng.randrange(8)
        return bytes(data)
    if kind == "foreign":
        how, value = _foreign(rng, files["other"], files["w1"], rank)
        return value if how == "bytes" else ("object", value)
    sd = torch.load(Path(files["own_path"].decode()), weights_only=True)
    return ("object", _nonfinite(sd, rng))


def _fuzz(rank: int, world_size: int, folder: str, w1: str) -> dict[str, Any]:
    state = _trained(rank, world_size)
    own = state.state_dict()
    torch.save(own, f"{folder}/rank{rank}.pt")
    every = state.gathered_state_dict()
    if rank == 0:
        torch.save(every, f"{folder}/gathered.pt")
    dist.barrier()
    files = {
        "own": Path(f"{folder}/rank{rank}.pt").read_bytes(),
        "own_path": f"{folder}/rank{rank}.pt".encode(),
        "other": Path(f"{folder}/rank{1 - rank}.pt").read_bytes(),
        "gathered": Path(f"{folder}/gathered.pt").read_bytes(),
        "w1": Path(w1).read_bytes(),
    }
    originals = {digest(own), digest(every)}
    before = digest(state.state_dict())
    rng = random.Random(1234 + rank)
    counts = {"refused": 0, "unchanged": 0}
    bad: list[str] = []
    path = f"{folder}/t{rank}.pt"
    for i in range(EXAMPLES):
        kind = KINDS[i % len(KINDS)]
        made = _tampered(kind, rng, files, rank)
        if isinstance(made, tuple):
            torch.save(made[1], path)
        else:
            Path(path).write_bytes(made)
        try:
            loaded = read(path)
            state.load_state_dict(loaded)
        except CaSyncError as exc:
            counts["refused"] += 1
            if kind == "nonfinite" and "non-finite" not in str(exc):
                bad.append(f"{kind} #{i}: refused for another reason: {exc}")
        except Exception as exc:  # (the defect this test looks for)
            bad.append(f"{kind} #{i}: raised {type(exc).__name__}: {exc}")
        else:
            if digest(loaded) in originals:
                counts["unchanged"] += 1  # (a flip in bytes torch does not read)
            else:
                bad.append(f"{kind} #{i}: accepted a changed checkpoint")
        if digest(state.state_dict()) != before:
            bad.append(f"{kind} #{i}: the state changed")
            before = digest(state.state_dict())
    return {"bad": bad, **counts}


def test_tampered_checkpoints_are_refused_with_casync_error(tmp_path: Path) -> None:
    w1 = str(tmp_path / "w1.pt")
    run_workers(_save_one, 1, w1)
    results = run_workers(_fuzz, 2, str(tmp_path), w1, timeout=240)
    for rank, got in enumerate(results):
        assert got["bad"] == [], f"rank {rank}: {got['bad'][:5]}"
        assert got["refused"] + got["unchanged"] == EXAMPLES
        assert got["refused"] >= EXAMPLES * 3 // 5  # (truncation, foreign, non-finite alone)
