"""hipress.fsdp.checkpoint.load on real gloo ranks: a torch.distributed.checkpoint that torch
cannot read (truncated or missing data file, missing or damaged .metadata, a damaged entry header,
a checkpoint saved without hipress) raises FsdpError naming the file and the reason on every rank,
where dcp.load raises torch's CheckpointException (a BaseException); a damaged hipress entry on
one rank makes every rank raise; nothing of it is logged as a traceback. Then seeded random
truncations and bit flips of the checkpoint's files (HIPRESS_FUZZ_EXAMPLES of them, default 8):
each is refused with FsdpError on every rank, or loads hipress's state exactly as saved (a flip
in the model's tensor bytes, which torch does not check)."""

from __future__ import annotations

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

EXAMPLES = int(os.environ.get("HIPRESS_FUZZ_EXAMPLES", "0")) or 8
PRELOAD = ("torch", "torch.distributed", "torch.distributed.fsdp", "hipress.fsdp", "fsdp_workers")


def _registered() -> tuple[nn.Module, Any]:
    torch.manual_seed(0)
    model = shard(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)))
    comp = hipress.fsdp.register(model, "onebit", min_compress_numel=1)
    model(torch.randn(4, 16)).square().sum().backward()  # every unit holds a residual now
    return model, comp


def _tamper(tag: str, root: Path, files: list[Path]) -> None:
    data = files[1].read_bytes()
    if tag == "truncated":
        files[1].write_bytes(data[: len(data) // 2])
    elif tag == "no metadata":
        (root / ".metadata").unlink()
    elif tag == "metadata flipped":
        meta = bytearray((root / ".metadata").read_bytes())
        meta[len(meta) // 3] ^= 0xFF
        (root / ".metadata").write_bytes(bytes(meta))
    elif tag == "header flipped":
        files[0].write_bytes(b"XXXX" + files[0].read_bytes()[4:])
    elif tag == "entry flipped":  # one bit inside rank 1's sealed hipress entry
        at = data.find(b"HPFSDP-SHA256") + 60
        files[1].write_bytes(data[:at] + bytes([data[at] ^ 4]) + data[at + 1 :])


TAGS = ["intact", "truncated", "no metadata", "metadata flipped", "header flipped",
        "entry flipped", "saved without hipress"]  # fmt: skip


def load_tampered(rank: int, world_size: int, root: str) -> dict[str, str]:
    model, comp = _registered()
    ckpt, foreign = Path(root) / "ckpt", Path(root) / "foreign"
    dcp.save({"model": model.state_dict(), "hipress": comp}, checkpoint_id=str(ckpt))
    dcp.save({"model": model.state_dict()}, checkpoint_id=str(foreign))
    files = sorted(ckpt.glob("*.distcp"))
    saved = {f: f.read_bytes() for f in [*files, ckpt / ".metadata"]}
    model2, comp2 = _registered()
    out = {}
    for tag in TAGS:
        dist.barrier()
        if rank == 0:
            for f, blob in saved.items():
                f.write_bytes(blob)
            _tamper(tag, ckpt, files)
        dist.barrier()
        where = foreign if tag == "saved without hipress" else ckpt
        try:
            hipress.fsdp.checkpoint.load({"model": model2.state_dict(), "hipress": comp2},
                                         checkpoint_id=str(where))  # fmt: skip
            out[tag] = "loaded"
        except FsdpError as exc:
            out[tag] = str(exc)
        except BaseException as exc:
            out[tag] = f"not an FsdpError: {type(exc).__name__}: {exc}"
    out["fuzz"] = _fuzz(rank, ckpt, saved, comp.state_dict()[f"rank{rank}"], model2, comp2)
    return out


def _fuzz(rank: int, ckpt: Path, saved: dict[Path, bytes], mine: bytes, model: nn.Module,
          comp: Any) -> str:  # fmt: skip
    """Each example's outcome on this rank, ``;``-joined: ``refused``, ``same`` (loaded, this
    rank's hipress state ``mine`` as saved) or what went wrong."""
    rng, outcomes = random.Random(7), []
    for i in range(EXAMPLES):
        f = rng.choice(sorted(saved))
        blob, at = bytearray(saved[f]), rng.randrange(len(saved[f]))
        if i % 2:
            blob[at] ^= 1 << rng.randrange(8)
        else:
            del blob[at:]
        dist.barrier()
        if rank == 0:
            for g, b in saved.items():
                g.write_bytes(b)
            f.write_bytes(bytes(blob))
        dist.barrier()
        try:
            hipress.fsdp.checkpoint.load({"model": model.state_dict(), "hipress": comp},
                                         checkpoint_id=str(ckpt))  # fmt: skip
            entry = comp.state_dict()[f"rank{rank}"]
            outcomes.append("same" if entry == mine else f"#{i} {f.name}@{at}: changed state")
        except FsdpError:
            outcomes.append("refused")
        except BaseException as exc:
            outcomes.append(f"#{i} {f.name}@{at}: {type(exc).__name__}: {exc}")
    return ";".join(outcomes)


def test_unreadable_checkpoints_raise_fsdp_error_on_every_rank(tmp_path: Path, capfd: Any) -> None:
    got = run_workers(load_tampered, 2, str(tmp_path), preload=PRELOAD, timeout=120)
    ckpt = str(tmp_path / "ckpt")
    for rank, out in enumerate(got):
        assert out["intact"] == "loaded"
        assert f"cannot load the checkpoint {ckpt}: its data file __1_0.distcp is truncated: " \
            in out["truncated"], out  # fmt: skip
        assert "it has no .metadata file" in out["no metadata"]
        assert "its .metadata file is damaged (" in out["metadata flipped"]
        assert "its data file __0_0.distcp is damaged: entry 'hipress.rank0' at byte 0 does not " \
            "deserialise" in out["header flipped"], out  # fmt: skip
        assert "has no entry 'hipress.version'" in out["saved without hipress"], out
        flip = out["entry flipped"]
        assert "entry rank1 is damaged: its bytes do not match the digest" in flip, out
        told = (f"loading the checkpoint {ckpt} failed on rank 1; this rank's state is left "
                f"as it was loaded" in flip and "\n  rank 1: FsdpError: " in flip)
        assert told == (rank == 0), out  # (rank 1 raises its own error)
    fuzz = [out["fuzz"].split(";") for out in got]
    assert fuzz[0] == fuzz[1], fuzz  # every rank ends alike
    assert set(fuzz[0]) <= {"refused", "same"}, fuzz[0]
    assert all(fuzz[0][i] == "refused" for i in range(0, EXAMPLES, 2)), fuzz[0]  # truncations
    assert "Traceback" not in capfd.readouterr().err
