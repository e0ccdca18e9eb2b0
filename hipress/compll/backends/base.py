"""What every backend implements (:class:`Backend`), the reference backend that defines what
they compute, and :func:`decode_sum_by_parts`, the definition of ``decode_sum``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from hipress.compll.ir import interp
from hipress.compll.ir import nodes as ir
from hipress.compll.ir.payload import pack, unpack
from hipress.compll.ir.source import CllError
from hipress.compll.ir.state import State
from hipress.compll.ir.types import DType, torch_compute_dtype
from hipress.compll.lower.finite import cast_bound


class BackendError(CllError):
    """A backend is unknown or cannot run here."""

    kind = "backend error"


class Backend(Protocol):
    """Executes one program. Outputs are caller-provided buffers; nothing is returned."""

    name: str

    def encode(
        self, grad: torch.Tensor, state: State, out: torch.Tensor
    ) -> bool | torch.Tensor | None:
        """Encode into ``out``; return whether ``grad`` holds NaN/Inf if the backend found out
        while encoding (a bool, or a 0-d bool tensor on the device), else None."""
        ...

    def decode(
        self, payload: torch.Tensor, n: int, out: torch.Tensor, accumulate: bool
    ) -> None: ...

    def decode_sum(
        self, payloads: Sequence[torch.Tensor], n: int, out: torch.Tensor, divisor: float
    ) -> None:
        """``out`` (contiguous float32) = sum of the payloads' decodes / ``divisor``."""
        ...


def decode_sum_by_parts(
    backend: Backend,
    payloads: Sequence[torch.Tensor],
    n: int,
    out: torch.Tensor,
    divisor: float,
) -> None:
    """``decode_sum`` payload by payload: each decoded into float32, divided by ``divisor``,
    and added to the sum of the ones before, in order (the first is the start): the definition
    of what every backend's ``decode_sum`` computes, and how the backends without a fused
    kernel run it. Dividing each decode first, like DDP divides each gradient before the sum,
    keeps a sum of N values near the float32 maximum finite."""
    # a float32 division by float32(divisor) on every device (CUDA divides by a Python number
    # as a multiplication by its reciprocal)
    div = torch.full((), divisor, dtype=torch.float32, device=out.device)
    tmp = None
    for r, p in enumerate(payloads):
        if r == 0:
            target = out
        else:
            tmp = target = tmp if tmp is not None else torch.empty_like(out)
        backend.decode(p, n, target, False)
        if divisor != 1:
            target.div_(div)
        if r > 0:
            out.add_(target)


class ReferenceBackend:
    """Runs the IR with the reference interpreter (torch ops; any device)."""

    name = "reference"

    def __init__(self, program: ir.Program) -> None:
        self.program = program

    def encode(self, grad: torch.Tensor, state: State, out: torch.Tensor) -> bool:
        p = self.program
        env = interp.Env(
            scalars={ir.N: torch.tensor(state.n, dtype=torch.int64)},
            arrays={p.encode.grad: grad.to(torch.float32)},
            seed=state.seed,
            step=state.step,
            tensor_id=state.tensor_id,
            device=grad.device,
        )
        for slot in p.state:
            t = state.tensors[slot.name]
            dt = slot.type if isinstance(slot.type, DType) else slot.type.dtype
            v = t.to(torch_compute_dtype(dt))
            if isinstance(slot.type, DType):
                env.scalars[slot.name] = v.reshape(())
            else:
                env.arrays[slot.name] = v
        new_state: dict[str, torch.Tensor] = {}
        interp.run(p.encode.ops, env, new_state)
        values = [
            env.arrays[f] if isinstance(f, str) else interp._eval(f, env) for f in p.encode.fields
        ]
        pack(p, state.n, values, out)
        for name, v in new_state.items():
            state.tensors[name].copy_(v.reshape(state.tensors[name].shape))
        g = env.arrays[p.encode.grad]
        bound = cast_bound(p)  # (a cast of g to f16/bf16: its overflow is flagged too)
        return not bool((torch.isfinite(g) if bound is None else g.abs() < bound).all())

    def decode(self, payload: torch.Tensor, n: int, out: torch.Tensor, accumulate: bool) -> None:
        p = self.program
        env = interp.Env(scalars={ir.N: torch.tensor(n, dtype=torch.int64)}, device=payload.device)
        for slot, v in zip(p.payload, unpack(p, n, payload), strict=True):
            name = f"{p.decode.payload}.{slot.name}"
            if isinstance(slot.type, DType):
                env.scalars[name] = v
            else:
                env.arrays[name] = v
        interp.run(p.decode.ops, env, {})
        res = env.arrays[p.decode.result]
        if accumulate:
            out.add_(res.to(out.dtype))
        else:
            out.copy_(res)

    def decode_sum(
        self, payloads: Sequence[torch.Tensor], n: int, out: torch.Tensor, divisor: float
    ) -> None:
        decode_sum_by_parts(self, payloads, n, out, divisor)


BackendFactory = Callable[[ir.Program], Backend]
