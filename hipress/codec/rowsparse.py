"""What row-sparse synchronisation shares between CaSync and the Horovod wrapper: the rows of a
2-D gradient that hold a non-zero (:func:`nonzero_rows`), the per-element error feedback of a
compressed row-sparse tensor (:class:`RowState`, a worker state under :func:`row_state_key`)
and the encode of a step's rows against it (:func:`encode_rows`). On the CPU the rows are
found by a CompLL kernel (``rowscan.cll``, beside this module), built at registration
(:func:`build_row_kernels`).

Error feedback: after encoding ``c = rows + residual[union]``, ``residual[union]`` becomes
``c - decode(payload)``; the rows outside the union keep their residual until a step touches
them again. The algorithm runs on a fresh state each step, drawing from the row state's key,
stream and step count, so an algorithm with error feedback of its own does not count the
residual twice.
"""

from __future__ import annotations

import functools
import logging
import zlib
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from hipress.codec.algorithm import rank_seed
from hipress.core.compression import CompressionAlgorithm
from hipress.core.plan import Plan

__all__ = [
    "RowState", "build_row_kernels", "encode_rows", "nonzero_rows", "own_rows", "row_flags",
    "row_state_key", "row_states", "scan_block", "scan_kernel", "sum_rows",
]  # fmt: skip

logger = logging.getLogger(__name__)


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
    """The indices of the rows of 2-D ``grad`` holding a bit that is not zero, ascending
    (int64; -0.0 counts as touched, every NaN too), for any layout, dtype and device.

    A contiguous float32 CPU tensor is scanned by the CompLL kernel ``rowscan.cll``
    (:func:`scan_kernel`: one pass at read bandwidth); every other tensor, or a CPU without a
    C compiler, reads its bits with torch (:func:`row_flags`)."""
    if grad.dim() != 2:
        raise ValueError(f"nonzero_rows takes a 2-D tensor, got shape {tuple(grad.shape)}")
    flags = None
    if _scannable(grad):
        flags = _scanned(grad)
    if flags is None:
        flags = row_flags(grad)
    return flags.nonzero().flatten()


def _scannable(grad: torch.Tensor) -> bool:
    cpu = grad.device.type == "cpu" and grad.dtype == torch.float32
    return cpu and grad.numel() > 0 and grad.is_contiguous()


def row_flags(grad: torch.Tensor) -> torch.Tensor:
    """Whether each row of 2-D ``grad`` holds a bit that is not zero (bool, one per row), read
    with torch: as 64-bit words where the layout allows, else as integers of the element's
    width (any strides), so -0.0 and NaN count as non-zero on every path."""
    size = grad.element_size()
    words = grad.numel() > 0 and grad.is_contiguous() and (size * grad.shape[1]) % 8 == 0
    if words and grad.data_ptr() % 8 == 0:
        return grad.view(torch.uint8).view(torch.int64).any(1)
    as_int = _SAME_WIDTH.get(size) if grad.is_floating_point() else None
    if as_int is not None:
        return grad.view(as_int).ne(0).any(1)
    return grad.ne(0).any(1)


_SAME_WIDTH = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}
SCAN_BLOCKS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)  # rowscan.cll's `seg` values


def scan_block(width: int) -> int:
    """The ``seg`` of ``rowscan.cll`` for rows of ``width`` >= 1 elements: the largest power of
    two dividing ``width``, at most 1024, so a row is a whole number of blocks (one where the
    width is a power of two up to 1024: the kernel's flags are then the rows')."""
    return min(width & -width, SCAN_BLOCKS[-1])


@functools.cache
def scan_kernel(seg: int) -> Any:
    """``rowscan.cll`` with ``seg`` on the CPU backend, its kernel built (generated, compiled or
    found in the kernel cache, loaded), or None where it cannot build (no C compiler; logged).
    One object per ``seg``: the program is fixed, so loading it again would only repeat work."""
    from hipress.compll import CllError, load_file  # deferred: only the CPU row path compiles

    path = Path(str(resources.files("hipress.codec").joinpath("rowscan.cll")))
    try:
        return load_file(path, backend="cpu", seg=seg).build_kernels("cpu")
    except CllError as exc:
        logger.warning("the row scan kernel cannot build (%s); rows are found with torch", exc)
        return None


def build_row_kernels(
    shapes: Iterable[tuple[str, Sequence[int] | None]], devices: Mapping[str, torch.device]
) -> None:
    """Build, now, the scan kernels :func:`nonzero_rows` would build at its first call for
    the 2-D parameters among ``shapes`` (``(name, shape)``; None: unknown) whose gradients live
    on the CPU (``devices``: name -> device; absent: the CPU), so that no step compiles. At most
    one kernel per distinct :func:`scan_block` of their widths."""
    segs = set()
    for name, shape in shapes:
        device = torch.device(devices.get(name, "cpu"))
        if shape is not None and len(shape) == 2 and shape[1] > 0 and device.type == "cpu":
            segs.add(scan_block(int(shape[1])))
    for seg in sorted(segs):
        scan_kernel(seg)


def _scanned(grad: torch.Tensor) -> torch.Tensor | None:
    rows, width = grad.shape
    seg = scan_block(width)
    alg = scan_kernel(seg)
    if alg is None:
        return None
    n = grad.numel()
    out = torch.empty(alg.payload_nbytes(n), dtype=torch.uint8)
    alg.encode(grad, alg.init_state(n), out)
    hits = out[: n // seg]
    return hits.view(rows, width // seg).any(1) if seg < width else hits


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


def own_rows(flat: torch.Tensor, idx: torch.Tensor, most: int,
             dtype: torch.dtype) -> torch.Tensor:  # fmt: skip
    """Rows ``idx`` of 2-D ``flat`` as ``dtype``, padded with zero rows to ``most``: what a rank
    all-gathers when exact rows travel as each rank's own (one size on every rank)."""
    own = torch.zeros(most, flat.shape[1], dtype=dtype, device=flat.device)
    own[: idx.numel()] = flat.index_select(0, idx)
    return own


def sum_rows(union: torch.Tensor, indices: Sequence[torch.Tensor],
             gathered: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """The ``union`` rows (sorted) of the sum of every rank's gradient, from each rank's own
    rows as all-gathered: ``gathered[r]`` begins with rank ``r``'s rows ``indices[r]`` (each a
    subset of ``union``; :func:`own_rows`). Summed in rank order from -0.0, then +0.0 added
    once to a row some rank did not touch (its gradient is +0.0 there), so the bits are those
    of summing every rank's whole rows: on two ranks an allreduce's, signed zeros included.
    The same bits on every rank."""
    acc = torch.full((union.numel(), gathered.shape[2]), -0.0, dtype=gathered.dtype,
                     device=gathered.device)  # fmt: skip
    seen = torch.zeros(union.numel(), dtype=torch.int64, device=gathered.device)
    for idx, got in zip(indices, gathered, strict=True):
        pos = torch.searchsorted(union, idx)
        acc.index_add_(0, pos, got[: idx.numel()])
        seen[pos] += 1
    short = (seen < len(indices)).nonzero().flatten()
    if short.numel():
        acc[short] += 0.0
    return acc
