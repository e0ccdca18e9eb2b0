"""What row-sparse synchronisation shares between CaSync and the Horovod wrapper: the rows of a
2-D gradient that hold a non-zero (:func:`nonzero_rows`), the per-element error feedback of a
compressed row-sparse tensor (:class:`RowState`, a worker state under :func:`row_state_key`)
and the encode of a step's rows against it (:func:`encode_rows`).

Error feedback: after encoding ``c = rows + residual[union]``, ``residual[union]`` becomes
``c - decode(payload)``; the rows outside the union keep their residual until a step touches
them again. The algorithm runs on a fresh state each step, drawing from the row state's key,
stream and step count, so an algorithm with error feedback of its own does not count the
residual twice.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any

import torch

from hipress.codec.algorithm import rank_seed
from hipress.core.compression import CompressionAlgorithm
from hipress.core.plan import Plan

__all__ = ["RowState", "encode_rows", "nonzero_rows", "row_state_key", "row_states"]


def row_state_key(name: str) -> str:
    """The worker-state key of compressed row-sparse parameter ``name``."""
    return f"{name}#rows"


class RowState:
    """Error feedback of one compressed row-sparse tensor: ``tensors["residual"]`` (float32,
    one per element), ``step`` (encodes so far), and the RNG key and stream the algorithm draws
    from. Checkpoints like an algorithm state (``state_dict`` / ``load_state_dict``)."""

    def __init__(self, n: int, device: torch.device, seed: int, tensor_id: int) -> None:
        self.n = n
        self.tensors = {"residual": torch.zeros(n, dtype=torch.float32, device=device)}
        self.step = 0
        self.seed = seed
        self.tensor_id = tensor_id

    def state_dict(self) -> dict[str, Any]:
        return {"n": self.n, "step": self.step, "seed": self.seed, "tensor_id": self.tensor_id,
                "tensors": {k: v.detach().cpu().clone() for k, v in self.tensors.items()}}  # fmt: skip

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        if not isinstance(sd, Mapping) or not isinstance(sd.get("tensors"), Mapping):
            raise ValueError("a row state dict is a dict with `tensors`")
        for key in ("n", "step", "seed", "tensor_id"):
            v = sd.get(key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"row state entry `{key}` must be an integer >= 0, got {v!r}")
        if sd["n"] != self.n:
            raise ValueError(f"row state is for {sd['n']} elements, this tensor has {self.n}")
        res = sd["tensors"].get("residual")
        if (
            not isinstance(res, torch.Tensor)
            or res.shape != (self.n,)
            or set(sd["tensors"]) != {"residual"}
        ):
            raise ValueError(f"row state entry `residual` must be a tensor of {self.n} elements")
        self.tensors["residual"].copy_(res)
        self.step, self.seed, self.tensor_id = sd["step"], sd["seed"], sd["tensor_id"]

    def reset(self) -> None:
        self.tensors["residual"].zero_()

    def reset_where(self, flag: torch.Tensor) -> None:
        self.tensors["residual"].masked_fill_(flag, 0)


def row_states(
    plan: Plan, rank: int, seed: int, devices: Mapping[str, torch.device]
) -> dict[str, RowState]:
    """The all-zero row states rank ``rank`` keeps under ``plan`` (compressed row-sparse
    entries only), by key."""
    out = {}
    for e in plan.entries:
        if e.row_bound and e.compress:
            key = row_state_key(e.name)
            device = devices.get(e.name, torch.device("cpu"))
            out[key] = RowState(e.numel, device, rank_seed(seed, rank), zlib.crc32(key.encode()))
    return out


def nonzero_rows(grad: torch.Tensor) -> torch.Tensor:
    """The indices of the rows of ``grad`` holding a bit that is not zero, ascending (-0.0
    counts as touched, NaN too): read as 64-bit words where the layout allows (one pass, 2-3x
    faster than comparing floats), else as values."""
    words = grad.element_size() * grad.shape[1]
    if grad.is_contiguous() and words % 8 == 0 and grad.data_ptr() % 8 == 0:
        flags = grad.view(torch.uint8).view(torch.int64).any(1)
    else:
        flags = grad.ne(0).any(1)
    return flags.nonzero().flatten()


def encode_rows(
    alg: CompressionAlgorithm, rows: torch.Tensor, union: torch.Tensor, state: RowState
) -> torch.Tensor:
    """The payload of ``rows`` (float32, the gradient's rows ``union``; overwritten) plus their
    residual; the residual becomes what the payload leaves out (zero where the rows are not
    finite, so error feedback is not poisoned)."""
    width = rows.shape[1]
    res = state.tensors["residual"].view(-1, width)
    c = rows.add_(res.index_select(0, union)).view(-1)
    k = c.numel()
    st = alg.init_state(k, device=rows.device, seed=state.seed, tensor_id=state.tensor_id)
    st.step = state.step
    payload = torch.zeros(alg.payload_nbytes(k), dtype=torch.uint8, device=rows.device)
    alg.encode(c, st, out=payload)
    state.step += 1
    left = c - alg.decode(payload, k)
    if not bool(torch.isfinite(c).all()):
        left.zero_()
    res.index_copy_(0, union, left.view(-1, width))
    return payload
