"""The codec surface every layer above relies on, and :class:`Uncompressed`, "no compression"
as a codec of its own.

CaSync, the Horovod wrapper and the reference model need only the CompLL
:class:`~hipress.compll.Algorithm` surface described by :class:`CompressionAlgorithm`: a static
payload size, per-tensor state, ``encode`` and ``decode`` (with ``accumulate`` for merging
without temporaries). Anything with that surface works.

:class:`Uncompressed` has the same surface (its payload is the float32 values themselves), so
code that holds a codec never holds ``None``; :func:`compresses` tells the two apart. A plan run
with :class:`Uncompressed` compresses no tensor.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

import torch

__all__ = ["CompressionAlgorithm", "Uncompressed", "compresses"]


@runtime_checkable
class CompressionAlgorithm(Protocol):
    """What CaSync calls on a compression algorithm (the CompLL ``Algorithm`` API).

    Guarantees CaSync relies on: ``payload_nbytes(n)`` is a static function of ``n`` and the
    parameters, a multiple of 8 and non-decreasing in ``n``; ``encode`` writes exactly that many
    bytes and advances ``state.step``; ``decode`` returns float32 and, with ``accumulate=True``,
    adds into ``out``.
    """

    name: str
    params: Mapping[str, Any]
    digest: str

    def payload_nbytes(self, n: int) -> int: ...

    def init_state(
        self, n: int, device: torch.device | str | None = None, seed: int = 0, tensor_id: int = 0
    ) -> Any: ...

    def encode(
        self, grad: torch.Tensor, state: Any, out: torch.Tensor | None = None
    ) -> torch.Tensor: ...

    def decode(
        self,
        payload: torch.Tensor,
        n: int,
        out: torch.Tensor | None = None,
        accumulate: bool = False,
    ) -> torch.Tensor: ...


class _NoState:
    """The state of :class:`Uncompressed`: nothing but a step count."""

    def __init__(self) -> None:
        self.step = 0
        self.tensors: dict[str, torch.Tensor] = {}

    def reset(self) -> None:
        self.step = 0

    def reset_where(self, flag: torch.Tensor) -> None:
        """Nothing to reset: there is no state to poison."""

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        self.step = int(sd.get("step", 0))


class Uncompressed:
    """No compression, as a codec: the payload of ``n`` elements is their float32 bytes (padded
    to a multiple of 8). ``name`` and ``digest`` are ``"none"``, ``params`` is empty."""

    name = "none"
    params: Mapping[str, Any] = MappingProxyType({})
    digest = "none"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Uncompressed)

    def __hash__(self) -> int:
        return hash(Uncompressed)

    def __repr__(self) -> str:
        return "Uncompressed()"

    def payload_nbytes(self, n: int) -> int:
        return (4 * n + 7) // 8 * 8

    def init_state(
        self, n: int, device: torch.device | str | None = None, seed: int = 0, tensor_id: int = 0
    ) -> _NoState:
        return _NoState()

    def encode(
        self, grad: torch.Tensor, state: Any, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``grad`` as float32 bytes into ``out`` (or a new buffer); advances ``state.step``."""
        n = grad.numel()
        if out is None:
            out = torch.zeros(self.payload_nbytes(n), dtype=torch.uint8, device=grad.device)
        out[: 4 * n].view(torch.float32).copy_(grad.reshape(-1))
        state.step += 1
        return out

    def decode(
        self,
        payload: torch.Tensor,
        n: int,
        out: torch.Tensor | None = None,
        accumulate: bool = False,
    ) -> torch.Tensor:
        """The float32 values of ``payload``, into ``out`` (added to it with ``accumulate``)."""
        values = payload[: 4 * n].view(torch.float32)
        if out is None:
            return values.clone()
        if accumulate:
            out.add_(values)
        else:
            out.copy_(values)
        return out


def compresses(algorithm: CompressionAlgorithm) -> bool:
    """Whether ``algorithm`` compresses anything (False for :class:`Uncompressed`)."""
    return not isinstance(algorithm, Uncompressed)
