"""A DDP communication hook for multi-round CompLL algorithms (PowerSGD): :func:`register_rounds`,
and the machinery it runs (:class:`RoundsRunner`), which CaSync's
:class:`~hipress.casync.rounds_engine.RoundsEngine` also runs: ``hipress.casync.register(ddp,
"powersgd")`` gives the same result bit for bit, with a plan (embeddings as exact rows),
checkpoints, statistics and timelines.

Each bucket's gradients are split as PyTorch's ``powerSGD_hook`` splits them: a tensor of two or
more dimensions whose rounds send fewer than ``1 / min_compression_rate`` of its bytes is
compressed, the rest (biases, small tensors) go in one plain all-reduce. A compressed tensor's
rounds run in order: round k's payloads of every compressed tensor of the bucket are concatenated
into one float32 buffer and all-reduced (summed); the next round's encode reads the sums; the
decode writes the mean into the gradient.

Order: every collective is issued from a hook call, in a fixed order on every rank (gloo needs
it): a hook call first advances each bucket still in flight by one round (waiting for its last
collective, then encoding and issuing the next round, or decoding after the last), oldest first,
then issues the new bucket's plain all-reduce and its first round. So a bucket's first round
overlaps the backward of the buckets after it; the last bucket's call finishes them all. Before
``start_iter`` steps every bucket is one plain all-reduce (error feedback starts with
compression, as in PyTorch's hook).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from hipress.codec.errors import CaSyncError
from hipress.compll.ir.state import State
from hipress.compll.rounds import RoundsAlgorithm, load_rounds

__all__ = [
    "RoundsHookState", "RoundsRunner", "compresses", "register_rounds", "rounds_hook",
    "shared_rounds",
]  # fmt: skip


Issue = Callable[[str, Callable[[], Any], int], Any]  # (what, launch, bytes) -> the work


@dataclass
class _Flight:
    """One bucket's step in flight."""

    buffer: torch.Tensor
    future: torch.futures.Future
    grads: list[torch.Tensor]  # the compressed gradients (views of the buffer)
    states: list[State]
    plain: list[torch.Tensor]  # the gradients all-reduced as they are
    staged: torch.Tensor | None = None  # the plain ones, concatenated
    works: list[Any] = field(default_factory=list)
    sums: list[list[torch.Tensor]] = field(default_factory=list)  # per round, per tensor
    send: torch.Tensor | None = None
    sizes: list[int] = field(default_factory=list)
    others: list[Any] = field(default_factory=list)  # (CaSync) the bucket's row-sparse part


def _launch(what: str, launch: Callable[[], Any], nbytes: int) -> Any:
    return launch()


class RoundsRunner:
    """The buckets of a step in flight through a multi-round algorithm (see the module
    docstring): :meth:`begin` a bucket, :meth:`step` after each hook call's new bucket.

    ``issue`` issues a collective (CaSync's counts and traces it), ``phase(figure)`` times an
    encode or decode. A flight's ``others`` (objects with ``deferred``, ``advance(group)``,
    ``future`` and ``settle()``: CaSync's row-sparse part of the bucket) advance with its
    rounds, and the flight completes once they did.
    """

    def __init__(self, algorithm: RoundsAlgorithm, group: Any, world: int,
                 issue: Issue = _launch,
                 phase: Callable[[str], AbstractContextManager[Any]] = lambda _: nullcontext(),
                 ) -> None:  # fmt: skip
        self.algorithm = algorithm
        self.group = group
        self.world = world
        self.issue = issue
        self.phase = phase
        self.flights: list[_Flight] = []
        self.sent_bytes = 0  # of the last step: plain and every round, per worker

    def begin(self, buffer: torch.Tensor, future: torch.futures.Future,
              grads: list[torch.Tensor], states: list[State], plain: list[torch.Tensor],
              others: Sequence[Any] = ()) -> None:  # fmt: skip
        """Issue a bucket's plain all-reduce and first round (``grads`` with ``states`` run the
        rounds, ``plain`` go as they are); ``future`` completes with ``buffer`` at its end."""
        fl = _Flight(buffer, future, grads, states, plain, others=list(others))
        if fl.plain:
            staged = fl.staged = torch.cat([g.reshape(-1) for g in fl.plain]).div_(self.world)
            nbytes = staged.numel() * staged.element_size()
            fl.works.append(self.issue(
                "rounds: plain allreduce", lambda: dist.all_reduce(
                    staged, group=self.group, async_op=True), nbytes))  # fmt: skip
            self.sent_bytes += nbytes
        self._issue(fl)
        self.flights.append(fl)

    def _issue(self, fl: _Flight) -> None:
        """Encode the flight's next round and issue its all-reduce (nothing if none left)."""
        k = len(fl.sums)
        if not fl.grads or k == len(self.algorithm.rounds):
            fl.send = None
            return
        alg = self.algorithm
        with self.phase("encode_ms"):
            parts = [
                alg.encode(k, g, st, [s[i] for s in fl.sums], self.world).view(torch.float32)
                for i, (g, st) in enumerate(zip(fl.grads, fl.states, strict=True))
            ]
            fl.sizes = [p.numel() for p in parts]
            send = fl.send = torch.cat(parts)
        fl.works.append(self.issue(
            f"rounds: {alg.rounds[k]} allreduce", lambda: dist.all_reduce(
                send, group=self.group, async_op=True), send.numel() * 4))  # fmt: skip
        self.sent_bytes += send.numel() * 4

    def _advance(self, fl: _Flight) -> bool:
        """Wait for the flight's collectives, then its next round or its end; True at the end."""
        for o in fl.others:
            if o.deferred:
                o.advance(self.group)
        for w in fl.works:
            w.wait()
        fl.works = []
        if fl.send is not None:
            fl.sums.append(list(torch.split(fl.send, fl.sizes)))
            self._issue(fl)
            if fl.send is not None:
                return False
        with self.phase("decode_ms"):
            for i, (g, st) in enumerate(zip(fl.grads, fl.states, strict=True)):
                out = self.algorithm.decode(g, st, [s[i] for s in fl.sums], self.world)
                g.copy_(out.view(g.shape))
            if fl.staged is not None:
                pos = 0
                for g in fl.plain:
                    g.copy_(fl.staged[pos : pos + g.numel()].view(g.shape))
                    pos += g.numel()
        for o in fl.others:
            o.future.wait()
            o.settle()
        fl.future.set_result(fl.buffer)
        return True

    def step(self, last: bool) -> None:
        """Advance every flight but the newest by one round (all of them to the end if
        ``last``), oldest first."""
        if last:
            while self.flights:
                self.flights = [f for f in self.flights if not self._advance(f)]
            return
        self.flights = [f for f in self.flights[:-1] if not self._advance(f)] + self.flights[-1:]


class RoundsHookState:
    """The state :func:`rounds_hook` runs over: the algorithm, per-parameter state, the buckets
    in flight (a :class:`RoundsRunner`). ``iterations`` counts finished steps."""

    def __init__(self, algorithm: RoundsAlgorithm | str = "powersgd",
                 params: dict[str, Any] | None = None, process_group: Any = None,
                 start_iter: int = 10, min_compression_rate: float = 2.0) -> None:  # fmt: skip
        if isinstance(algorithm, str):
            algorithm = shared_rounds(algorithm, "auto", params)
        elif params:
            raise CaSyncError("params go with an algorithm given by name")
        if isinstance(start_iter, bool) or not isinstance(start_iter, int) or start_iter < 0:
            raise CaSyncError(f"start_iter must be an integer >= 0, got {start_iter!r}")
        if not min_compression_rate > 0:
            raise CaSyncError(f"min_compression_rate must be > 0, got {min_compression_rate!r}")
        self.algorithm = algorithm
        self.group = process_group
        self.world = dist.get_world_size(process_group)
        self.start_iter = start_iter
        self.min_compression_rate = float(min_compression_rate)
        self.iterations = 0
        self.states: dict[int, State] = {}
        self.runner = RoundsRunner(algorithm, process_group, self.world)

    @property
    def sent_bytes(self) -> int:
        """Bytes sent in the last step: plain and every round, per worker."""
        return self.runner.sent_bytes

    @sent_bytes.setter
    def sent_bytes(self, value: int) -> None:
        self.runner.sent_bytes = value

    def _compress(self, grad: torch.Tensor) -> bool:
        return grad.dtype == torch.float32 and compresses(
            self.algorithm, grad.shape, self.min_compression_rate
        )

    def start(self, bucket: dist.GradBucket) -> torch.futures.Future:
        buf = bucket.buffer()
        fut: torch.futures.Future = torch.futures.Future()
        if self.iterations < self.start_iter:
            self.runner.begin(buf, fut, [], [], [buf])
            return fut
        grads, states, plain = [], [], []
        for p, g in zip(bucket.parameters(), bucket.gradients(), strict=True):
            if self._compress(g):
                grads.append(g)
                states.append(self._state(p, g))
            else:
                plain.append(g)
        self.runner.begin(buf, fut, grads, states, plain)
        return fut

    def _state(self, param: torch.Tensor, grad: torch.Tensor) -> State:
        st = self.states.get(id(param))
        if st is None or st.n != grad.numel():
            st = self.states[id(param)] = self.algorithm.init_state(grad.shape, grad.device)
        return st

    def step(self, last: bool) -> None:
        """Advance every flight but the newest by one round (all of them to the end if
        ``last``, which ends the step), oldest first."""
        self.runner.step(last)
        if last:
            self.iterations += 1


_LOADED: dict[str, RoundsAlgorithm] = {}


def shared_rounds(name: str, backend: str, params: Mapping[str, Any] | None) -> RoundsAlgorithm:
    """The shipped multi-round algorithm ``name`` with ``params`` on ``backend``, loaded once
    per process (its kernels, built per leading dimension, are shared; states are not)."""
    key = repr((name, backend, sorted(dict(params or {}).items())))
    alg = _LOADED.get(key)
    if alg is None:
        alg = _LOADED[key] = load_rounds(name, backend, **dict(params or {}))
    return alg


def compresses(algorithm: RoundsAlgorithm, shape: Sequence[int],
               min_compression_rate: float = 2.0) -> bool:  # fmt: skip
    """Whether a float32 gradient of ``shape`` runs ``algorithm``'s rounds, as PyTorch's
    ``powerSGD_hook`` decides: two or more dimensions, and the rounds' payloads less than
    ``1 / min_compression_rate`` of its bytes."""
    if len(shape) < 2:
        return False
    numel = int(torch.Size(shape).numel())
    return numel * 4 >= sum(algorithm.round_nbytes(shape)) * min_compression_rate


def rounds_hook(state: RoundsHookState, bucket: dist.GradBucket) -> torch.futures.Future:
    """DDP communication hook: ``bucket`` averaged over the workers through ``state``'s
    multi-round algorithm; register with ``ddp.register_comm_hook(state, rounds_hook)``."""
    if bucket.index() == 0:
        state.sent_bytes = 0
    state.step(False)
    fut = state.start(bucket)
    if bucket.is_last():
        state.step(True)
    return fut


rounds_hook.__annotations__ = {
    "state": RoundsHookState,
    "bucket": dist.GradBucket,
    "return": torch.futures.Future[torch.Tensor],
}


def register_rounds(ddp_model: DistributedDataParallel, algorithm: RoundsAlgorithm | str = "powersgd",
                    *, params: dict[str, Any] | None = None, start_iter: int = 10,
                    min_compression_rate: float = 2.0) -> RoundsHookState:  # fmt: skip
    """Register :func:`rounds_hook` on ``ddp_model`` with a multi-round algorithm (e.g.
    ``register_rounds(ddp, "powersgd", params={"rank": 4})``); returns its state."""
    if not isinstance(ddp_model, DistributedDataParallel):
        raise CaSyncError(
            f"register_rounds needs a DistributedDataParallel model, got {type(ddp_model).__name__}"
        )
    state = RoundsHookState(algorithm, params, ddp_model.process_group, start_iter,
                            min_compression_rate)  # fmt: skip
    ddp_model.register_comm_hook(state, rounds_hook)
    return state
