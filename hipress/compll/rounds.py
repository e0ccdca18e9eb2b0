"""Multi-round algorithms: :class:`RoundsAlgorithm`, :func:`load_rounds`, :func:`load_rounds_file`.

A multi-round algorithm (docs/reference/compll-language.md, "Multi-round algorithms") runs, per
step and tensor: round 1's encode, an all-reduce (sum) of its payload, round 2's encode (which
reads that sum), an all-reduce, ..., then the decode on every round's sum. Each encode and the
decode is an ordinary single-round program (:mod:`hipress.compll.frontend.rounds`), so every
backend runs them and gives the reference interpreter's bytes. The gradient's 2-D view
(``rows``: its leading dimension) specialises the programs: one set of kernels per distinct
leading dimension, built on first use.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from hipress.compll.algorithm import Algorithm, _parsed, _resolve_backend, _shipped, shipped_path
from hipress.compll.backends.base import Backend
from hipress.compll.frontend.check import elaborate
from hipress.compll.frontend.rounds import Stages, is_rounds, split
from hipress.compll.ir import nodes as ir
from hipress.compll.ir.payload import layout
from hipress.compll.ir.source import CllError, SourceFile
from hipress.compll.ir.state import State

AllReduce = Callable[[torch.Tensor], torch.Tensor]  # f32 payload -> its sum over the workers
BackendSpec = str | Callable[[ir.Program], Backend]


def view_rows(shape: Sequence[int]) -> int:
    """The rows of a gradient's 2-D view: its leading dimension (1 for a 0-d tensor); the
    columns are the product of the rest, as ``tensor.view(shape[0], -1)``."""
    return int(shape[0]) if len(shape) >= 1 and int(shape[0]) > 0 else 1


class RoundsAlgorithm:
    """A multi-round algorithm ready to run.

    Attributes:
        name, doc: from its ``algorithm`` declaration.
        rounds: the payloads' names, in round order.
        params: the hyper-parameters given (defaults filled in by each stage).
        digest: a hash of every stage's IR (at one row) and the parameters, equal on every
            rank that loaded the same algorithm.
    """

    def __init__(self, source: SourceFile, stages: Stages, backend: BackendSpec = "auto",
                 params: dict[str, Any] | None = None) -> None:  # fmt: skip
        self.source = source
        self.stages = stages
        self.backend = backend
        self.name = stages.algo.name
        self.doc = stages.algo.doc
        self.rounds = stages.names
        self._params = dict(params or {})
        self._by_rows: dict[int, list[Algorithm]] = {}
        self.params = dict(self.stage_algorithms(1)[0].params)
        self.params.pop("rows", None)
        self.digest = hashlib.sha256(
            "|".join(a.digest for a in self.stage_algorithms(1)).encode()
        ).hexdigest()[:16]

    def __repr__(self) -> str:
        ps = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"RoundsAlgorithm({self.name}({ps}), rounds={list(self.rounds)})"

    def stage_algorithms(self, rows: int) -> list[Algorithm]:
        """The rounds' encodes then the decode, as single-round algorithms, for ``rows``."""
        algs = self._by_rows.get(rows)
        if algs is None:
            algs = []
            for m in self.stages.modules:
                prog = elaborate(self.source, m, {**self._params, "rows": rows})
                be = (
                    _resolve_backend(self.backend, prog)
                    if isinstance(self.backend, str)
                    else self.backend(prog)
                )
                algs.append(Algorithm(prog, be, self.source.path))
            self._by_rows[rows] = algs
        return algs

    def _algs(self, shape: Sequence[int], n: int) -> list[Algorithm]:
        rows = view_rows(shape)
        if n % rows:
            raise ValueError(f"{self.name}: {n} elements do not make {rows} rows")
        return self.stage_algorithms(rows)

    def round_nbytes(self, shape: Sequence[int]) -> list[int]:
        """Bytes of each round's payload for a gradient of ``shape`` (multiples of 8)."""
        n = int(torch.Size(shape).numel())
        return [a.payload_nbytes(n) for a in self._algs(shape, n)[:-1]]

    def init_state(self, shape: Sequence[int], device: torch.device | str | None = None,
                   seed: int = 0, tensor_id: int = 0) -> State:  # fmt: skip
        """Zero state for a gradient of ``shape`` (the declared state, the summed payloads and
        ``world``)."""
        n = int(torch.Size(shape).numel())
        return self._algs(shape, n)[0].init_state(n, device, seed, tensor_id)

    def _fill(self, alg: Algorithm, state: State, name: str, summed: torch.Tensor) -> None:
        fields, total = layout(alg.program, state.n)
        if summed.dtype != torch.float32 or summed.numel() * 4 != total:
            raise ValueError(
                f"{self.name}: round `{name}`'s sum must be {total // 4} float32 values, "
                f"got {summed.numel()} {summed.dtype}"
            )
        raw = summed.reshape(-1).view(torch.uint8)
        for f in fields:
            t = state.tensors[f"{name}_{f.name}"]
            count = t.numel()
            t.view(-1).copy_(raw[f.offset : f.offset + count * 4].view(torch.float32))

    def _world(self, state: State, world: int) -> None:
        if isinstance(world, bool) or not isinstance(world, int) or world < 1:
            raise ValueError(f"{self.name}: world must be an integer >= 1, got {world!r}")
        state.tensors["world"].fill_(world)

    def encode(self, k: int, grad: torch.Tensor, state: State,
               summed: Sequence[torch.Tensor] = (), world: int = 1) -> torch.Tensor:  # fmt: skip
        """Round ``k``'s payload (uint8) for ``grad``, given the sums (float32 views of the
        summed payloads) of the rounds before it and the number of workers."""
        algs = self._algs(grad.shape, grad.numel())
        if not 0 <= k < len(self.rounds) or len(summed) != k:
            raise ValueError(
                f"{self.name}: round {k} takes the sums of the {k} round(s) before it "
                f"(rounds 0..{len(self.rounds) - 1}), got {len(summed)}"
            )
        for j, s in enumerate(summed):
            self._fill(algs[j], state, self.rounds[j], s)
        self._world(state, world)
        step = state.step
        try:
            return algs[k].encode(grad, state)
        finally:
            state.step = step

    def decode(self, grad: torch.Tensor, state: State, summed: Sequence[torch.Tensor],
               world: int) -> torch.Tensor:  # fmt: skip
        """The step's result (float32, ``grad``'s element count) from every round's sum;
        updates ``state`` and advances ``state.step``."""
        algs = self._algs(grad.shape, grad.numel())
        if len(summed) != len(self.rounds):
            raise ValueError(f"{self.name}: decode takes {len(self.rounds)} sums")
        for j, s in enumerate(summed):
            self._fill(algs[j], state, self.rounds[j], s)
        self._world(state, world)
        out = algs[-1].encode(grad, state)
        return out.view(torch.float32)[: grad.numel()]

    def step(self, grad: torch.Tensor, state: State, allreduce: AllReduce,
             world: int) -> torch.Tensor:  # fmt: skip
        """Every round in order, each payload summed by ``allreduce`` (e.g. a
        ``torch.distributed.all_reduce`` of the float32 view), then the decode."""
        sums: list[torch.Tensor] = []
        for k in range(len(self.rounds)):
            payload = self.encode(k, grad, state, sums, world)
            sums.append(allreduce(payload.view(torch.float32)))
        return self.decode(grad, state, sums, world)


def load_rounds_source(source: SourceFile, backend: BackendSpec = "auto",
                       **params: Any) -> RoundsAlgorithm:  # fmt: skip
    """Check a multi-round ``source`` with ``params`` and bind it to ``backend`` (a name, or a
    function making a backend of a program)."""
    module = _parsed(source.path, source.text)
    if not is_rounds(module):
        raise CllError(f"{source.path}: not a multi-round algorithm (load it with load_source)")
    return RoundsAlgorithm(source, split(source, module), backend, params)


def load_rounds_file(path: str | Path, backend: BackendSpec = "auto",
                     **params: Any) -> RoundsAlgorithm:  # fmt: skip
    return load_rounds_source(SourceFile.read(path), backend, **params)


def load_rounds(name: str, backend: BackendSpec = "auto", **params: Any) -> RoundsAlgorithm:
    """Load a shipped multi-round algorithm by name, e.g. ``load_rounds("powersgd", rank=4)``."""
    return load_rounds_file(shipped_path(name), backend, **params)


def rounds_algorithms() -> list[str]:
    """Names of the shipped multi-round algorithms."""
    return [n for n, rounds in _shipped() if rounds]
