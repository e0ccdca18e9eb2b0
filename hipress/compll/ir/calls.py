"""Validation of what an encode or decode is given, once, for every backend.

A kernel trusts its pointers: a state array shorter than the program declares, a payload of the
wrong size, a tensor on another device or a misaligned buffer would become a write past the end,
a CUDA fault that poisons the context, or silently wrong values. :class:`~hipress.compll.
algorithm.Algorithm` calls these checks before any backend runs, so each mistake is a
:class:`CallError` that names the tensor, what was expected and what was given.

Payloads and their buffers must start at a multiple of 8 bytes (their fields are 8-byte aligned
within; a GPU faults on a misaligned float load). A tensor from ``torch.empty`` is; a row of a
larger buffer is when every row's size is a multiple of 8.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hipress.compll.ir import interp
from hipress.compll.ir import nodes as ir
from hipress.compll.ir.source import CllError
from hipress.compll.ir.state import State
from hipress.compll.ir.types import ArrayType, DType, torch_storage_dtype

FLOATS = (torch.float32, torch.float16, torch.bfloat16)
ALIGN = 8
MAX_ELEMENTS = 1 << 40  # elements of one tensor: far beyond any device, and no size overflows


class CallError(CllError, ValueError):
    """An encode or decode was given a tensor it cannot use (see module doc)."""

    kind = "invalid call"


class CallTypeError(CallError, TypeError):
    """... of the wrong type or dtype."""


def check_count(name: str, n: object) -> int:
    """An element count: an integer in [0, :data:`MAX_ELEMENTS`]."""
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_ELEMENTS:
        raise CallError(f"{name}: element count must be an integer in [0, 2**40], got {n!r}")
    return n


def _where(t: torch.Tensor) -> str:
    return f"{tuple(t.shape)} {t.dtype} on {t.device}{'' if t.is_contiguous() else ' (strided)'}"


def check_payload(name: str, what: str, payload: torch.Tensor, nbytes: int, n: int,
                  device: torch.device | None = None, label: str = "payload") -> None:  # fmt: skip
    """A payload (``label``: or the buffer an encode writes it to): 1-D contiguous uint8 of
    ``nbytes`` bytes, 8-byte aligned, on ``device`` if given."""
    if not isinstance(payload, torch.Tensor):
        raise CallTypeError(
            f"{name}.{what}: {label} must be a tensor, got {type(payload).__name__}"
        )
    if (
        payload.dtype != torch.uint8
        or payload.dim() != 1
        or payload.shape[0] != nbytes
        or not payload.is_contiguous()
    ):
        raise CallError(
            f"{name}.{what}: {label} must be a 1-D contiguous uint8 tensor of {nbytes} bytes "
            f"for n={n}, got {_where(payload)}"
        )
    if device is not None and payload.device != device:
        raise CallError(f"{name}.{what}: {label} is on {payload.device}, the data on {device}")
    if nbytes and payload.data_ptr() % ALIGN:
        raise CallError(
            f"{name}.{what}: {label} must start at a multiple of {ALIGN} bytes (address "
            f"{payload.data_ptr():#x}); rows of a larger buffer need sizes that are multiples "
            f"of {ALIGN}"
        )


StateSpec = dict[str, tuple[tuple[int, ...], torch.dtype]]


def state_spec(program: ir.Program, n: int) -> StateSpec:
    """Every declared state entry's shape and storage dtype for ``n`` elements."""
    spec: StateSpec = {}
    for slot in program.state:
        if isinstance(slot.type, ArrayType):
            length = interp.eval_size(slot.type.length, n)
            spec[slot.name] = ((length,), torch_storage_dtype(slot.type.dtype))
        else:
            assert isinstance(slot.type, DType)
            spec[slot.name] = ((), torch_storage_dtype(slot.type))
    return spec


def check_state(name: str, spec: StateSpec, state: State, device: torch.device) -> None:
    """``state`` holds every entry of ``spec`` (:func:`state_spec` for ``state.n``), each of
    its shape and dtype, contiguous and on ``device``."""
    if not isinstance(state, State):
        raise CallTypeError(f"{name}.encode: state must be a State (init_state), got "
                            f"{type(state).__name__}")  # fmt: skip
    for key, (shape, dt) in spec.items():
        t = state.tensors.get(key)
        if t is None:
            raise CallError(f"{name}.encode: the state has no `{key}` (init_state makes one)")
        if tuple(t.shape) != shape or t.dtype != dt or not t.is_contiguous():
            raise CallError(
                f"{name}.encode: state `{key}` must be a contiguous {dt} tensor of shape "
                f"{shape} for n={state.n}, got {_where(t)}"
            )
        if t.device != device:
            raise CallError(
                f"{name}.encode: state `{key}` is on {t.device}, the gradient on {device} "
                "(init_state(n, device=...) puts it there)"
            )


def check_encode(name: str, spec: StateSpec, grad: torch.Tensor, state: State,
                 out: torch.Tensor | None, nbytes: int) -> None:  # fmt: skip
    """An encode's gradient, state (``spec``: :func:`state_spec`) and payload buffer."""
    if not isinstance(grad, torch.Tensor) or grad.dtype not in FLOATS:
        got = grad.dtype if isinstance(grad, torch.Tensor) else type(grad).__name__
        raise CallTypeError(f"{name}.encode needs a float32/float16/bfloat16 tensor, got {got}")
    check_state(name, spec, state, grad.device)
    if grad.numel() != state.n:
        raise CallError(
            f"{name}.encode: the state is for {state.n} elements, the gradient has {grad.numel()}"
        )
    if out is not None:
        check_payload(name, "encode", out, nbytes, state.n, grad.device, label="out")


def check_output(name: str, what: str, out: torch.Tensor, n: int, device: torch.device) -> None:
    """A decode's output: a float tensor of ``n`` elements on ``device``."""
    if not isinstance(out, torch.Tensor) or out.dtype not in FLOATS or out.numel() != n:
        got = _where(out) if isinstance(out, torch.Tensor) else type(out).__name__
        raise CallError(f"{name}.{what}: out must be a float tensor of {n} elements, got {got}")
    if out.device != device:
        raise CallError(f"{name}.{what}: out is on {out.device}, the payload on {device}")


def check_payloads(name: str, what: str, payloads: Sequence[torch.Tensor], nbytes: int,
                   n: int) -> torch.device:  # fmt: skip
    """Payloads for one decode_sum: at least one, all valid, on one device (returned)."""
    if not payloads:
        raise CallError(f"{name}.{what} needs at least one payload")
    device = payloads[0].device if isinstance(payloads[0], torch.Tensor) else None
    for p in payloads:
        check_payload(name, what, p, nbytes, n, device)
    assert device is not None
    return device


__all__ = ["ALIGN", "MAX_ELEMENTS", "CallError", "CallTypeError", "StateSpec", "check_count", "check_encode", "check_output", "check_payload",
           "check_payloads", "check_state", "state_spec"]  # fmt: skip
