"""Per-tensor algorithm state: declared state arrays/scalars plus the RNG counters.

A :class:`State` is created by :meth:`Algorithm.init_state` (all declared state zero), passed to
every :meth:`Algorithm.encode` call for the same tensor, and advanced by it (``step`` += 1).
It pickles and round-trips through :meth:`state_dict` / :meth:`load_state_dict`, so error
feedback survives checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class State:
    """Mutable per-tensor state of one algorithm instance.

    Fields:
        n: element count of the tensor this state belongs to.
        tensors: declared state, name -> tensor (arrays are 1-D, scalars are 0-d), zero-initialised.
        step: how many times encode has run with this state; part of the RNG counter.
        seed: RNG key (64-bit); the runtime mixes the worker rank into it so workers draw
            independent random numbers.
        tensor_id: RNG stream of this tensor (32-bit), e.g. a hash of the parameter name.
    """

    n: int
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    step: int = 0
    seed: int = 0
    tensor_id: int = 0

    def state_dict(self) -> dict[str, Any]:
        """Return a checkpointable copy (tensors cloned to CPU)."""
        return {
            "n": self.n,
            "step": self.step,
            "seed": self.seed,
            "tensor_id": self.tensor_id,
            "tensors": {k: v.detach().cpu().clone() for k, v in self.tensors.items()},
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`, in place (tensors keep their device). A checkpoint
        of dgc, graddrop or topk written before they kept their state unmasked loads too
        (:func:`_unmasked`)."""
        if not isinstance(sd, dict):
            raise ValueError(f"a state dict is a dict, got {type(sd).__name__}")
        counters = {}
        for key in ("n", "step", "seed", "tensor_id"):
            v = sd.get(key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"state dict entry `{key}` must be an integer >= 0, got {v!r}")
            counters[key] = v
        if counters["n"] != self.n:
            raise ValueError(f"state is for {sd['n']} elements, this tensor has {self.n}")
        if not isinstance(sd.get("tensors"), dict):
            raise ValueError("state dict entry `tensors` must be a dict of tensors")
        sd = {**sd, "tensors": _unmasked(sd["tensors"], self.tensors)}
        missing = set(self.tensors) ^ set(sd["tensors"])
        if missing:
            raise ValueError(f"state entries do not match: {sorted(missing)}")
        for k, v in sd["tensors"].items():
            mine = self.tensors[k]
            if not isinstance(v, torch.Tensor) or v.shape != mine.shape:
                got = tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__
                raise ValueError(
                    f"state entry `{k}` has shape {got}, this tensor's has {tuple(mine.shape)}"
                )
            if v.dtype != mine.dtype and not (v.is_floating_point() and mine.is_floating_point()):
                raise ValueError(f"state entry `{k}` is {v.dtype}, this tensor's is {mine.dtype}")
            if v.layout != torch.strided or v.device.type == "meta":
                where = "a meta tensor" if v.device.type == "meta" else f"layout {v.layout}"
                raise ValueError(f"state entry `{k}` holds no dense values ({where})")
        for k, v in sd["tensors"].items():
            self.tensors[k].copy_(v)
        self.step = counters["step"]
        self.seed = counters["seed"]
        self.tensor_id = counters["tensor_id"]

    def reset(self) -> None:
        """Zero every declared state entry (keeps step, seed and tensor id)."""
        for t in self.tensors.values():
            t.zero_()

    def reset_where(self, flag: torch.Tensor) -> None:
        """:meth:`reset` if the 0-d bool tensor ``flag`` is set, decided on its device (no
        read back to the host)."""
        for t in self.tensors.values():
            t.masked_fill_(flag, 0)


def _unmasked(
    old: dict[str, torch.Tensor], mine: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """``old`` as this state's entries, where it is the masked form of a sparsifier's state.

    Older versions of dgc, graddrop and topk kept ``residual`` (and dgc ``u``) with what a step
    sent already zeroed; they now keep ``comp`` unmasked and mark what the last step sent
    (``plast``: the last position taken, and ``pthr``/``poff`` or ``pmin``), zeroing it at the
    next step. The old residual is such a ``comp`` with nothing marked sent: ``plast`` -1 (topk:
    and ``pmin`` +inf), not ``lost``; dgc's ``u`` carries over as it is."""
    if "residual" not in old or "residual" in mine or not {"comp", "plast"} <= set(mine):
        return old
    out = {k: v for k, v in old.items() if k != "residual"}
    out["comp"] = old["residual"]
    for name, t in mine.items():
        if name not in out:
            value = -1 if name == "plast" else float("inf") if name == "pmin" else 0
            out[name] = torch.full_like(t, value, device="cpu")
    return out
