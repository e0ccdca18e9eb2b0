"""The compression state of a model on one rank: :class:`FsdpCompression`, what
:func:`~hipress.fsdp.register` returns.

It reports per-rank memory and counters, and checkpoints through ``state_dict`` /
``load_state_dict``; it is a ``Stateful``, so ``torch.distributed.checkpoint`` saves and loads it
next to the model. The state dict holds the configuration it belongs to (algorithm and its
digest, feedback, world size and the plan's decisions per unit) as plain values and each rank's
states serialised under ``"rank{r}"`` (one value per rank, whatever the units, so that a
checkpoint of another configuration always reaches :meth:`FsdpCompression.load_state_dict`,
which refuses it with an :class:`FsdpError` saying what differs). Each rank's entry is sealed
with a SHA-256 digest of its bytes (a damaged entry is refused) and its states must be finite
where the next step uses them. A checkpoint of the same configuration saved at another number of
ranks is resharded, keeping the sums over ranks of the residuals (:mod:`hipress.fsdp.reshard`).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultReduceScatter

from hipress.codec.integrity import check_finite
from hipress.codec.logs import RANK_FILTER
from hipress.core.compression import CompressionAlgorithm
from hipress.core.torchcompat import fsdp_param_groups
from hipress.fsdp.collective import CompressedReduceScatter, UnitStats
from hipress.fsdp.errors import FsdpError
from hipress.fsdp.metrics import snapshot
from hipress.fsdp.planning import FsdpPlan
from hipress.fsdp.replicate import ReplicaAllReduce
from hipress.fsdp.reshard import load_resharded

logger = logging.getLogger(__name__)
logger.addFilter(RANK_FILTER)

__all__ = ["SPARE_RANKS", "STATE_VERSION", "FsdpCompression"]

STATE_VERSION = 2
# rank 0 saves an empty entry for every rank from the world size up to this one, so that a run on
# more ranks finds its key in a torch.distributed.checkpoint and is refused by load_state_dict
# (a key missing from the checkpoint would fail inside torch's loader, as a CheckpointException).
# Each entry costs torch's checkpointing about 0.4 ms to save and to load: 256 cover the usual
# jobs for about 0.1 s a checkpoint
SPARE_RANKS = 256
# a sealed entry: these bytes, the SHA-256 of the rest, the rest (torch.save's bytes); an
# entry without them was saved before entries were sealed, and loads with a warning
_SEALED = b"HPFSDP-SHA256\0"


class FsdpCompression:
    """The compression state of one model on one rank: a :class:`CompressedReduceScatter` per
    FSDP unit (``units``, by module name; the root module is ``"<root>"``) and, with replicas,
    a :class:`ReplicaAllReduce` per unit (``replicas``).

    Fields: ``algorithm``, ``feedback`` (resolved), ``rank`` and ``world_size`` (global),
    ``units``, ``replicas``, ``plan`` (the :class:`~hipress.fsdp.planning.FsdpPlan`: which
    units compress and why; ``print(comp.plan)`` shows its table).
    """

    def __init__(
        self,
        algorithm: CompressionAlgorithm,
        feedback: str,
        units: dict[str, CompressedReduceScatter],
        modules: dict[str, FSDPModule],
        replicas: dict[str, ReplicaAllReduce] | None = None,
        plan: FsdpPlan | None = None,
    ) -> None:
        self.algorithm, self.feedback, self.units = algorithm, feedback, units
        self.replicas = replicas or {}
        self.plan = plan or FsdpPlan("default", {})
        self._modules = modules
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()

    def __repr__(self) -> str:
        on = sum(u.compress for u in self.units.values())
        extra = f", {len(self.replicas)} replica hooks" if self.replicas else ""
        return (
            f"FsdpCompression({self.algorithm.name}, feedback={self.feedback}, "
            f"plan={self.plan.kind}, {on}/{len(self.units)} units compressed{extra})"
        )

    def stats(self) -> dict[str, Any]:
        """Counters of the reduce-scatters summed over units, and per unit (``"units"``);
        the replica all-reduces' under ``"replicas"``; as plain dicts."""
        per = {name: asdict(u.stats) for name, u in self.units.items()}
        total = {k: sum(s[k] for s in per.values()) for k in asdict(UnitStats())}
        reps = {name: asdict(h.stats) for name, h in self.replicas.items()}
        return {**total, "units": per, "replicas": reps}

    def metrics(self) -> dict[str, float]:
        """The counters as a flat snapshot for a logger (:func:`hipress.fsdp.metrics.snapshot`:
        ``hipress/bytes_ratio``, ... with the names of docs/reference/metrics.md)."""
        return snapshot(self)

    def memory(self) -> dict[str, int]:
        """Per-rank memory in bytes: ``params_shard`` (this rank's shards of the units'
        parameters, what plain FSDP2 keeps, and again for their gradients), ``feedback`` (error
        feedback memory) and ``state`` (all compression state, feedback included)."""
        shard = 0
        for m in self._modules.values():
            for p in _own_params(m):
                local = p.to_local() if hasattr(p, "to_local") else p
                shard += local.numel() * local.element_size()
        parts = [*self.units.values(), *self.replicas.values()]
        return {
            "params_shard": shard,
            "feedback": sum(u.feedback_bytes() for u in parts),
            "state": sum(u.state_bytes() for u in parts),
        }

    def state_dict(self) -> dict[str, Any]:
        """This rank's compression state, with the configuration it belongs to (see the module
        docstring): ``version``, ``algorithm``, ``digest``, ``feedback``, ``world_size``,
        ``plan`` (JSON ``{unit: compress}``) and, under ``"rank{r}"`` (global rank), the
        serialised per-unit states (CPU copies); rank 0 adds empty entries for the ranks
        after the last, up to :data:`SPARE_RANKS`."""
        mine: dict[str, Any] = {}
        for name, u in self.units.items():
            mine[name] = {"chunks": u.state_dict()}
            if name in self.replicas:
                mine[name]["replica"] = self.replicas[name].state_dict()
        buf = io.BytesIO()
        torch.save(mine, buf)
        blob = buf.getvalue()
        sealed = _SEALED + hashlib.sha256(blob).digest() + blob
        out: dict[str, Any] = {**self._config(), f"rank{self.rank}": sealed}
        if self.rank == 0:
            out.update({f"rank{r}": b"" for r in range(self.world_size, SPARE_RANKS)})
        return out

    def _config(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "algorithm": self.algorithm.name,
            "digest": str(getattr(self.algorithm, "digest", "")),
            "feedback": self.feedback,
            "world_size": self.world_size,
            "plan": json.dumps(self.plan.mapping(), sort_keys=True),
        }

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        """Restore from :meth:`state_dict` (this rank's entry), all units or none. Raises
        :class:`FsdpError` if it was saved with another algorithm, feedback option, plan or
        model, or is damaged. Saved at another world size, it is resharded
        (:func:`~hipress.fsdp.reshard.load_resharded`, a collective: every rank loads)."""
        if not isinstance(sd, Mapping):
            raise FsdpError(f"a hipress.fsdp state dict is a mapping, got {type(sd).__name__}")
        saved_ws = sd.get("world_size")
        moved = isinstance(saved_ws, int) and saved_ws > 0 and saved_ws != self.world_size
        for key, want in self._config().items():
            if sd.get(key) != want and not (moved and key == "world_size"):
                raise FsdpError(_mismatch(key, sd.get(key), want))
        if moved:
            logger.warning("hipress.fsdp: the checkpoint was saved at %d ranks, this run has "
                           "%d: its error feedback is resharded (the sums over ranks are kept)",
                           saved_ws, self.world_size)  # fmt: skip
            load_resharded(self, sd)
            return
        mine = self._entry(sd.get(f"rank{self.rank}"))
        for name, u in self.units.items():
            entry = mine[name]
            if not isinstance(entry, Mapping) or "chunks" not in entry:
                raise FsdpError(f"the checkpoint's entry for {name} is malformed")
            u.load_state_dict(dict(entry["chunks"]))
            if name in self.replicas:
                self.replicas[name].load_state_dict(dict(entry.get("replica") or {}))

    def _entry(self, blob: Any, rank: int | None = None) -> Mapping[str, Any]:
        """The per-unit states of ``rank``'s serialised entry (default: this rank's), checked
        against its digest and for non-finite values."""
        rank = self.rank if rank is None else rank
        key = f"the checkpoint's entry rank{rank}"
        if isinstance(blob, bytes) and blob.startswith(_SEALED):
            head = len(_SEALED) + 32
            if hashlib.sha256(blob[head:]).digest() != blob[len(_SEALED) : head]:
                raise FsdpError(
                    f"{key} is damaged: its bytes do not match the digest saved with them (a "
                    "bit flip, a partial write or an edit); resume from an intact checkpoint, "
                    "or leave hipress's state out of what you load (error feedback then starts "
                    "afresh)"
                )
            blob = blob[head:]
        elif blob:
            logger.warning("hipress.fsdp: %s carries no digest (saved by an earlier hipress): "
                           "loaded unverified", key)  # fmt: skip
        try:
            mine = torch.load(io.BytesIO(blob), weights_only=True) if blob else None
        except Exception as exc:  # a truncated or foreign entry: any unpickling error
            raise FsdpError(f"{key} is damaged: {exc}") from None
        if not isinstance(mine, Mapping) or set(mine) != set(self.units):
            raise FsdpError(
                f"the checkpoint has no matching entry for rank {rank}'s units {sorted(self.units)}"
            )
        for name, entry in mine.items():
            _check_finite(name, entry, key)
        return mine

    def remove(self) -> None:
        """Give every unit back FSDP2's default reduce-scatter (a replica hook stays: FSDP2
        has no call to remove one)."""
        for m in self._modules.values():
            m.set_custom_reduce_scatter(DefaultReduceScatter())


def _own_params(module: FSDPModule) -> list[torch.Tensor]:
    groups = fsdp_param_groups(module._get_fsdp_state())
    return [fp.sharded_param for g in groups for fp in g.fsdp_params]


def _check_finite(unit: str, entry: Any, where: str) -> None:
    """Refuse a unit's saved chunk states (and residuals) holding NaN/Inf the next step uses."""
    coders = entry.get("chunks") if isinstance(entry, Mapping) else None
    replica = entry.get("replica") if isinstance(entry, Mapping) else None
    parts = [("", coders)] + ([("replica ", {"0": replica["replica"]})]
                              if isinstance(replica, Mapping) and "replica" in replica else [])  # fmt: skip
    for label, chunks in parts:
        if not isinstance(chunks, Mapping):
            continue  # (the unit's loader names the malformed entry)
        states: dict[str, Any] = {}
        for j, c in chunks.items():
            if not isinstance(c, Mapping):
                continue
            states[f"{unit} {label}chunk {j}"] = c.get("alg")
            if isinstance(c.get("residual"), Mapping):
                states[f"{unit} {label}chunk {j} residual"] = {"tensors": c["residual"]}
        check_finite(states, where, FsdpError)


def _mismatch(key: str, got: Any, want: Any) -> str:
    """The message for a checkpoint whose ``key`` is ``got`` where this run has ``want``."""
    if key in ("algorithm", "digest"):
        what = "algorithm" if key == "algorithm" else "algorithm's parameters (digest)"
        return (
            f"the checkpoint's {what} is {got!r}, this run registers {want!r}: its "
            "compression states do not fit. Register with the algorithm and parameters it was "
            "saved with to resume it, or leave hipress's state out of what you load (error "
            "feedback then starts afresh)"
        )
    if key == "plan" and isinstance(got, str):
        try:
            saved = json.loads(got)
        except ValueError:
            saved = None
        if isinstance(saved, dict):
            mine = json.loads(want)
            differ = sorted(set(saved.items()) ^ set(mine.items()))
            names = sorted({k for k, _ in differ})
            return (
                f"the checkpoint compresses other units than this run (units {names}: "
                f"checkpoint {saved}, this run {mine}), so their states would not be "
                f"restored; register with plan={saved} to resume it"
            )
    return (
        f"the checkpoint's {key} is {got!r}, this run's {want!r}; load it into the "
        "configuration it was saved with"
    )
