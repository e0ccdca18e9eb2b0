"""The CaSync DDP communication hook, its state object and :func:`register`.

Use::

    ddp = DistributedDataParallel(model)
    state = hipress.casync.register(ddp, algorithm="terngrad", params={"bitwidth": 2})
    ...  # train as usual; state.stats.last has the figures of the last step
    torch.save(state.state_dict(), f"casync-rank{rank}.pt")  # one file per rank

The hook follows DDP's contract: it is a plain function ``casync_hook(state, bucket)`` returning a
future that holds one tensor shaped like ``bucket.buffer()``, averaged over the world size, in the
bucket's dtype. Every collective is issued from the hook call itself, in bucket order, so every
rank issues them in the same order (on gloo too). A PS bucket's second phase is issued from the
next bucket's hook call (or at once for the last bucket), which overlaps it with backward. Ring
rounds run on a thread of their own (point-to-point messages take no part in that order). The
last bucket's call returns once every bucket of the step is synchronised.
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import json
import logging
import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from hipress.casync.algorithm import CompressionAlgorithm, init_chunk_states, resolve_algorithm
from hipress.casync.bulk import BucketSchedule, Workspace, build_schedule
from hipress.casync.checkpoint import load_states, save_states
from hipress.casync.errors import CaSyncError, CommError, ConfigMismatchError
from hipress.casync.planning import DefaultRule, resolve_plan
from hipress.casync.ring import RingDriver
from hipress.casync.stats import SyncStats
from hipress.casync.strategies import BucketOp, SyncContext, all_gather
from hipress.casync.unused import UnusedGuard, supported
from hipress.secopa.plan import Plan

__all__ = ["CaSyncState", "casync_hook", "register"]

logger = logging.getLogger(__name__)

_FORMAT = "hipress.casync/1"
_DIGEST_BYTES = 16
_NOTE_BYTES = 512


# every live state's ring driver, closed and joined when the interpreter exits: a daemon thread
# still running then, or a hop still pending when the process group goes, aborts the process
_RINGS: weakref.WeakSet[RingDriver] = weakref.WeakSet()


@atexit.register
def _close_rings() -> None:
    rings = list(_RINGS)
    for ring in rings:
        ring.close()
    for ring in rings:
        ring.join(timeout=120)


def _as_error(exc: BaseException) -> CaSyncError:
    return exc if isinstance(exc, CaSyncError) else CaSyncError(f"CaSync: {exc}")


def _hash(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()[:_DIGEST_BYTES]


class CaSyncState:
    """State of :func:`casync_hook` for one DDP model on one rank.

    Args:
        algorithm: a CompLL algorithm name, an algorithm object, or None for no compression.
        params: the algorithm's hyper-parameters (with a name only).
        named_parameters: (name, parameter) pairs of every parameter that receives a gradient,
            or (name, numel) pairs when there is no model (benchmarks).
        plan: a :class:`~hipress.secopa.Plan`, a plan file, ``"auto"`` or None (default rule).
        process_group: group to synchronise over (None: the default group).
        seed: base RNG seed; each rank mixes its rank in.
        backend: CompLL backend for a named algorithm ("auto", "cpu", "reference").
        rule: the default rule used when ``plan`` is None.
        check_finite: look for NaN/Inf in every bucket (one pass) so they reach every rank
            and do not poison error feedback. Disable only if the model cannot produce them.
        log_every: log a summary every this many steps (0: never).
        warmup_steps: synchronise the first this many steps uncompressed (DDP's own allreduce,
            bit for bit), leaving every algorithm state untouched; compression starts at step
            ``warmup_steps`` (like ``start_powerSGD_iter`` of PyTorch's PowerSGD hook, and
            DGC's warm-up). The step count is kept in :meth:`state_dict`.
        params_schedule: ``(step, params)`` pairs, steps ascending: from that step on, the
            algorithm runs with ``params`` updating the earlier ones, keeping every state
            (error feedback, momentum, RNG counters). E.g. DGC's warm-up, which sends a larger
            fraction in the first epochs: ``[(0, {"s_percent": 0.25}), (500, {"s_percent":
            0.0625}), ...]``. Part of the configuration every rank must agree on; only for an
            algorithm given by name, and only parameters that leave its state layout as it is.
            The plan keeps its decisions. A restored :meth:`state_dict` resumes with the
            parameters of its step.

    Fields:
        algorithm, plan, rank, world_size, seed: as resolved at construction (plan always set).
        stats: :class:`~hipress.casync.stats.SyncStats` of this rank.
        worker_states, server_states: per-chunk algorithm states (error feedback, momentum).

    Validation happens here, eagerly: a bad plan or algorithm raises before training starts.
    The state pickles without its process group, parameter binding, buffers and in-flight
    work; after unpickling, :meth:`bind` it to the model and register it again.
    """

    def __init__(
        self,
        algorithm: str | CompressionAlgorithm | None = "terngrad",
        params: Mapping[str, Any] | None = None,
        *,
        named_parameters: Iterable[tuple[str, torch.Tensor | int]],
        plan: Plan | str | Path | None = None,
        process_group: dist.ProcessGroup | None = None,
        seed: int = 0,
        backend: str = "auto",
        rule: DefaultRule | None = None,
        check_finite: bool = True,
        log_every: int = 100,
        warmup_steps: int = 0,
        params_schedule: Sequence[tuple[int, Mapping[str, Any]]] = (),
        device: torch.device | str | None = None,
    ) -> None:
        _check_options(params, seed, rule, check_finite, log_every, warmup_steps, plan)
        schedule = _check_schedule(params_schedule, algorithm, params)
        if not dist.is_initialized():
            raise CaSyncError("torch.distributed is not initialised: call init_process_group first")
        named = list(named_parameters)
        if not named:
            raise CaSyncError("the model has no parameter that requires a gradient")
        numels = [(n, int(p) if isinstance(p, int) else p.numel()) for n, p in named]
        home = torch.device(device) if device is not None else None
        devices = {
            n: p.device if isinstance(p, torch.Tensor) else home or torch.device("cpu")
            for n, p in named
        }
        trained_on = next((p.device for _, p in named if isinstance(p, torch.Tensor)), home)
        self.process_group = process_group
        self.rank = dist.get_rank(process_group)
        self.world_size = dist.get_world_size(process_group)
        self._spec = (
            (algorithm, dict(params or {}), backend) if isinstance(algorithm, str) else None
        )
        self.algorithm = resolve_algorithm(algorithm, params, backend)
        self.plan = resolve_plan(
            plan, self.algorithm, numels, self.world_size, rule, group=process_group,
            device=trained_on,
        )  # fmt: skip
        self.seed = int(seed)
        self.check_finite = bool(check_finite)
        self.warmup_steps = warmup_steps
        self.params_schedule = schedule
        self._base_params = dict(params or {})
        self.stats = SyncStats(log_every=log_every)
        self._decisions = {e.name: e for e in self.plan.entries}
        if self.algorithm is None:
            self.worker_states: dict[str, Any] = {}
            self.server_states: dict[str, Any] = {}
        else:
            self.worker_states, self.server_states = init_chunk_states(
                self.algorithm, self.plan, self.rank, self.world_size, self.seed, devices
            )
        self._base_digests = (
            self.algorithm.digest if self.algorithm is not None else "none",
            self.plan.digest(),
        )
        self._init_runtime()
        if schedule:
            self._apply_params(self._params_at(0))
        self.bind(named)
        compressed = sum(e.compress for e in self.plan.entries)
        logger.info(
            "casync: %s, %d of %d tensors compressed, world size %d",
            self.plan.algorithm,
            compressed,
            len(self.plan.entries),
            self.world_size,
        )

    def _init_runtime(self) -> None:
        self._ctx = SyncContext(
            rank=self.rank,
            world_size=self.world_size,
            algorithm=self.algorithm,
            worker_states=self.worker_states,
            server_states=self.server_states,
            stats=self.stats,
            check_finite=self.check_finite,
        )
        # the ring's thread ends with this state (it holds the driver, never the state), and
        # at the latest when the interpreter exits
        weakref.finalize(self, self._ctx.ring.close)
        _RINGS.add(self._ctx.ring)
        self._param_names: dict[int, str] = {}
        self._cache: dict[tuple[Any, ...], tuple[BucketSchedule, Workspace, int]] = {}
        self._pending: list[BucketOp] = []
        self._inflight: list[BucketOp] = []  # this step's buckets
        self._warm: list[torch.futures.Future[torch.Tensor]] = []  # this warm-up step's
        self._agreed = False
        self._step = 0
        self._lock = threading.Lock()
        self._unused: UnusedGuard | None = None  # see watch_unused
        self._open = False  # a step's first bucket was submitted

    # ---- binding and configuration ----------------------------------------------------------

    def bind(self, named_parameters: Iterable[tuple[str, torch.Tensor | int]]) -> None:
        """Map the model's parameter objects to their names (buckets list parameter objects)."""
        self._param_names = {id(p): n for n, p in named_parameters if isinstance(p, torch.Tensor)}

    def names_of(self, parameters: Sequence[torch.Tensor]) -> list[str]:
        """Names of a bucket's parameters; raises if one was not bound."""
        try:
            return [self._param_names[id(p)] for p in parameters]
        except KeyError:
            raise CaSyncError(
                "a bucket holds a parameter this state does not know: call state.bind("
                "model.named_parameters()) after unpickling, and register the state with the "
                "DDP model it was made for"
            ) from None

    def config_digest(self) -> dict[str, str]:
        """What every rank must agree on: algorithm, plan and options, as hex digests (with a
        ``params_schedule``, of the first parameters: the schedule is among the options)."""
        alg = self.algorithm
        return {
            "algorithm": self._base_digests[0] if alg is not None else "none",
            "plan": self._base_digests[1],
            "options": _hash(
                json.dumps(
                    {
                        "format": _FORMAT,
                        "seed": self.seed,
                        "finite": self.check_finite,
                        "warmup": self.warmup_steps,
                        "schedule": [[at, dict(p)] for at, p in self.params_schedule],
                    }
                )
            ).hex(),
        }

    def _describe_config(self) -> str:
        alg = self.algorithm
        what = f"{alg.name} {dict(alg.params)}" if alg is not None else "no compression"
        compressed = sum(e.compress for e in self.plan.entries)
        return (
            f"{what}; plan {self.plan.digest()} ({compressed}/{len(self.plan.entries)} "
            f"compressed); seed {self.seed}; check_finite {self.check_finite}; warmup "
            f"{self.warmup_steps}"
        )

    def _check_agreement(self, device: torch.device) -> None:
        """Exchange config digests (one small all-gather, on ``device``: the buckets', which
        the group's backend serves, e.g. CUDA for NCCL); on any difference, exchange
        descriptions and raise :class:`ConfigMismatchError` on every rank."""
        mine = self.config_digest()
        keys = sorted(mine)
        local = torch.frombuffer(
            bytearray(b"".join(_hash(mine[k]) for k in keys)), dtype=torch.uint8
        ).to(device)
        gathered = torch.empty(self.world_size * local.numel(), dtype=torch.uint8, device=device)
        all_gather(gathered, local, group=self.process_group)
        gathered = gathered.cpu()  # (once per training)
        rows = gathered.view(self.world_size, len(keys), _DIGEST_BYTES)
        differ = [k for i, k in enumerate(keys) if not bool((rows[:, i] == rows[0, i]).all())]
        if not differ:
            self._agreed = True
            return
        note = self._describe_config().encode()[:_NOTE_BYTES].ljust(_NOTE_BYTES, b"\0")
        notes = torch.empty(self.world_size * _NOTE_BYTES, dtype=torch.uint8, device=device)
        mine_note = torch.frombuffer(bytearray(note), dtype=torch.uint8).to(device)
        all_gather(notes, mine_note, group=self.process_group)
        notes = notes.cpu()
        lines = [
            f"  rank {r}: "
            + bytes(notes[r * _NOTE_BYTES : (r + 1) * _NOTE_BYTES].tolist())
            .rstrip(b"\0")
            .decode(errors="replace")
            for r in range(self.world_size)
        ]
        raise ConfigMismatchError(
            f"CaSync ranks disagree on {', '.join(differ)}; every rank must register the same "
            "algorithm, parameters, plan and options:\n" + "\n".join(lines)
        )

    def _params_at(self, step: int) -> dict[str, Any]:
        """The algorithm's parameters in force at ``step`` under ``params_schedule``."""
        assert self._spec is not None
        params = dict(self._base_params)
        for at, update in self.params_schedule:
            if at <= step:
                params.update(update)
        return params

    def _apply_params(self, params: dict[str, Any]) -> None:
        """Switch to the algorithm with ``params`` (between steps), keeping every state."""
        assert self._spec is not None
        name, current, backend = self._spec
        if params == current:
            return
        alg = resolve_algorithm(name, params, backend)
        assert alg is not None
        self._spec = (name, params, backend)
        self.algorithm = alg
        self.plan = dataclasses.replace(self.plan, params=dict(alg.params))
        self._ctx.algorithm = alg
        self._cache.clear()  # payload sizes may differ: new layouts and buffers
        logger.info("casync: step %d: %s parameters now %s", self._step, name, dict(alg.params))

    # ---- the engine -------------------------------------------------------------------------

    def _schedule(
        self, names: Sequence[str], buffer: torch.Tensor
    ) -> tuple[BucketSchedule, Workspace]:
        key = (tuple(names), buffer.dtype, buffer.device)
        hit = self._cache.get(key)
        if hit is None:
            decisions = [self._decisions[n] for n in names]
            alg = self.algorithm
            schedule = build_schedule(
                names,
                [d.numel for d in decisions],
                decisions,
                self.world_size,
                alg.payload_nbytes if alg is not None else None,
            )
            workspace = Workspace(schedule, self.world_size, buffer.device, buffer.dtype)
            logger.debug(
                "casync: new bucket layout of %d tensors, %d rounds",
                len(names),
                len(schedule.rounds),
            )
            hit = (schedule, workspace, self._step)
        self._cache[key] = (hit[0], hit[1], self._step)
        return hit[0], hit[1]

    def submit(
        self, buffer: torch.Tensor, names: Sequence[str], last: bool
    ) -> torch.futures.Future[torch.Tensor]:
        """Start synchronising a flat ``buffer`` holding the gradients of parameters ``names``
        (in order); ``last`` marks the step's last bucket. Every rank must submit the same
        layouts in the same order. Returns a future completing with ``buffer``, averaged.

        Raises :class:`ConfigMismatchError` at the first call if ranks disagree, and
        :class:`CommError` if that check or a collective of an earlier bucket of this step
        failed (a peer died or stalled past the process group's timeout).
        """
        with self._lock:
            if not self._open:
                self._open = True
                if self._unused is not None:
                    self._unused.step_open()
            if not self._agreed:
                try:
                    self._check_agreement(buffer.device)
                except CaSyncError:
                    raise
                except Exception as exc:  # gloo/NCCL error: a peer died or timed out
                    raise CommError(
                        "CaSync: the first step's configuration check failed (a peer may have "
                        "exited or stalled past the process group's timeout; see the other "
                        f"ranks' logs): {exc}"
                    ) from exc
            if self._step < self.warmup_steps:
                fut = self._allreduce_bucket(buffer, last)
                self._warm.append(fut)
                if last:
                    warm, self._warm = self._warm, []
                    self._end_step()
                    for f in warm:  # raise a failure as the CommError it is (see below)
                        try:
                            f.wait()
                        except Exception as exc:
                            cause = exc.__cause__ or exc
                            msg = str(cause).split("CommError: ", 1)[-1]
                            raise CommError(msg if "CaSync" in msg else f"CaSync: {msg}") from exc
                return fut
            earlier, self._pending = self._pending, []
            op: BucketOp | None = None
            try:
                schedule, workspace = self._schedule(names, buffer)
                self.stats.bucket_submitted(last)
                if self._unused is not None:
                    self._unused.before_encode(names)
                op = BucketOp(self._ctx, schedule, workspace, buffer)
                self._inflight.append(op)
                op.start(self.process_group)
                for other in earlier:
                    other.advance(self.process_group)
                if last:
                    op.advance(self.process_group)
                    # DDP waits for every bucket right after this call anyway; waiting here
                    # raises a failure as the CaSyncError it is (DDP cannot unwrap a future
                    # that a completion callback or the ring thread failed)
                    for other in self._inflight:
                        other.future.wait()
                elif op.deferred:
                    self._pending.append(op)
            except BaseException as exc:
                # fail every bucket of the step, so no future is left waiting forever, and let
                # nothing it issued stay pending (see BucketOp.drain)
                err = op.fail(exc) if op is not None else _as_error(exc)
                for other in self._inflight:
                    other.fail(err)
                for other in self._inflight:
                    other.drain()
                self._inflight = []
                self.stats.abandon_step()
                raise err from exc
            if last:
                self._inflight = []
                self._end_step()
            return op.future

    def _allreduce_bucket(
        self, buffer: torch.Tensor, last: bool
    ) -> torch.futures.Future[torch.Tensor]:
        """A warm-up step's bucket: DDP's default hook (divide, then allreduce)."""
        stats = self.stats
        nbytes = buffer.numel() * buffer.element_size()
        stats.bucket_submitted(last)
        stats.add(bytes_uncompressed=nbytes, bytes_sent=nbytes, collectives=1)
        buffer.div_(self.world_size)
        try:
            work = dist.all_reduce(buffer, group=self.process_group, async_op=True)
        except Exception as exc:
            stats.abandon_step()
            raise CommError(f"CaSync: warm-up allreduce could not be issued: {exc}") from exc

        def done(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
            # runs on the backend's thread: holds the stats, never the process group
            try:
                out = fut.value()[0]
            except Exception as exc:
                stats.abandon_step()
                raise CommError(
                    "CaSync: warm-up allreduce failed (a peer may have exited or stalled past "
                    f"the process group's timeout; see the other ranks' logs): {exc}"
                ) from exc
            stats.bucket_finished()
            return out

        return work.get_future().then(done)

    def _end_step(self) -> None:
        self._open = False
        if self._unused is not None:
            self._unused.step_done()
        stale = [k for k, (_, _, used) in self._cache.items() if used < self._step]
        for k in stale:  # layouts of buckets DDP rebuilt: free their buffers
            del self._cache[k]
        self._step += 1
        if self.params_schedule:
            self._apply_params(self._params_at(self._step))

    def close(self) -> None:
        """End the state's ring thread (also done when the state is collected). A closed
        state cannot run ring rounds any more."""
        self._ctx.ring.close()

    def watch_unused(self, ddp_model: DistributedDataParallel) -> None:
        """Keep error feedback whole under ``find_unused_parameters=True``: the states of a
        parameter no rank used in a step are restored after it, as if it had not been
        synchronised (DDP leaves its gradient untouched). :func:`register` calls this."""
        if self._unused is not None:
            self._unused.remove()
        named = [(self._param_names[id(p)], p) for p in ddp_model.module.parameters()
                 if id(p) in self._param_names]  # fmt: skip
        self._unused = UnusedGuard(ddp_model, named, (self.worker_states, self.server_states))

    # ---- checkpoints and pickling -----------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """This rank's algorithm states (error feedback, momentum, RNG counters), CPU copies.

        States differ per rank: save one per rank and load each into the same rank.
        """
        if self._unused is not None and not self._open:
            self._unused.settle()
        sd = save_states(_FORMAT, self.rank, self.world_size, self.config_digest(), self._parts())
        sd["step"] = self._step
        return sd

    def _parts(self) -> dict[str, dict[str, Any]]:
        return {"worker": self.worker_states, "server": self.server_states}

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` in place, all or nothing. Raises :class:`CaSyncError`
        (naming the rank and the entry) if it was saved by another rank or world size, for
        another algorithm, plan or options, or is damaged (a missing entry, a tensor of
        another shape or dtype, a step that is not an integer >= 0)."""
        step = sd.get("step", 0) if isinstance(sd, Mapping) else 0
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise CaSyncError(
                f"rank {self.rank}: state dict `step` must be an integer >= 0, got {step!r}"
            )
        load_states(
            sd, fmt=_FORMAT, what="CaSync", rank=self.rank, world_size=self.world_size,
            config=self.config_digest(), parts=self._parts(), error=CaSyncError,
        )  # fmt: skip
        if self._unused is not None:
            self._unused.forget()
        self._step = step  # where warm-up and the schedule stand
        if self.params_schedule:
            self._apply_params(self._params_at(self._step))

    def __getstate__(self) -> dict[str, Any]:
        runtime = (
            "process_group", "_ctx", "_param_names", "_cache", "_pending", "_inflight", "_lock",
            "_warm", "_unused", "_open",
        )  # fmt: skip
        d = {k: v for k, v in self.__dict__.items() if k not in (*runtime, "_agreed", "_step")}
        if self._spec is not None:
            d["algorithm"] = None  # reloaded from the spec: compiled kernels do not pickle
        return d

    def __setstate__(self, d: dict[str, Any]) -> None:
        self.__dict__.update(d)
        self.process_group = None
        if self._spec is not None:
            name, params, backend = self._spec
            if self.params_schedule:  # the step count does not pickle: start from step 0
                params = self._params_at(0)
                self._spec = (name, params, backend)
            self.algorithm = resolve_algorithm(name, params, backend)
        self._init_runtime()


def _whole(name: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise CaSyncError(f"{name} must be an integer >= 0, got {v!r}")


def _check_options(params: Any, seed: Any, rule: Any, check_finite: Any, log_every: Any,
                   warmup_steps: Any, plan: Any) -> None:  # fmt: skip
    """:class:`CaSyncState`'s arguments, each with a message that names it and says what it
    takes."""
    if params is not None and not isinstance(params, Mapping):
        raise CaSyncError(
            f"params must be a dict of the algorithm's parameters, e.g. {{'bitwidth': 2}}, got "
            f"{params!r}"
        )
    _whole("seed", seed)
    _whole("log_every", log_every)
    _whole("warmup_steps", warmup_steps)
    if not isinstance(check_finite, bool):
        raise CaSyncError(f"check_finite must be True or False, got {check_finite!r}")
    if rule is not None and not isinstance(rule, DefaultRule):
        raise CaSyncError(f"rule must be a DefaultRule or None, got {rule!r}")
    if isinstance(plan, str) and plan != "auto" and plan.strip().lower() == "auto":
        raise CaSyncError(f"plan={plan!r}: SeCoPa's automatic plan is plan='auto'")
    if plan is not None and not isinstance(plan, Plan | str | Path):
        raise CaSyncError(
            f"plan must be a Plan, a path to a plan file, 'auto' or None, got {plan!r}"
        )


def _check_schedule(
    schedule: Sequence[tuple[int, Mapping[str, Any]]],
    algorithm: str | CompressionAlgorithm | None,
    params: Mapping[str, Any] | None,
) -> tuple[tuple[int, dict[str, Any]], ...]:
    """Validate ``params_schedule`` eagerly (with the reference backend: nothing compiles):
    ascending steps, an algorithm given by name, and the same state layout at every entry."""
    if (
        isinstance(schedule, str | bytes)
        or not isinstance(schedule, Sequence)
        or not all(
            isinstance(x, Sequence) and len(x) == 2 and isinstance(x[1], Mapping) for x in schedule
        )
    ):
        raise CaSyncError(
            f"params_schedule must be a list of (step, params) pairs, e.g. [(0, {{'s_percent': "
            f"0.25}}), (500, {{'s_percent': 0.001}})], got {schedule!r}"
        )
    out = tuple((at, dict(p)) for at, p in schedule)
    if not out:
        return out
    if not isinstance(algorithm, str):
        raise CaSyncError("params_schedule needs the algorithm given by name, e.g. 'dgc'")
    steps = [at for at, _ in out]
    if any(
        isinstance(a, bool) or not isinstance(a, int) or a < 0 for a in steps
    ) or steps != sorted(set(steps)):
        raise CaSyncError(f"params_schedule steps must be ascending integers >= 0, got {steps}")
    merged = dict(params or {})
    base = resolve_algorithm(algorithm, merged, "reference")
    assert base is not None

    def layout(alg: CompressionAlgorithm) -> list[dict[str, tuple[Any, Any]]]:
        return [
            {k: (t.shape, t.dtype) for k, t in alg.init_state(n, device="meta").tensors.items()}
            for n in (1, 997, 1 << 16)
        ]

    want = layout(base)
    for at, update in out:
        merged.update(update)
        alg = resolve_algorithm(algorithm, merged, "reference")
        assert alg is not None
        if layout(alg) != want:
            raise CaSyncError(
                f"params_schedule step {at}: {algorithm} with {merged} keeps a different state "
                "than with its first parameters, so the state cannot carry over"
            )
    return out


def casync_hook(state: CaSyncState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: synchronise ``bucket`` as ``state``'s plan says.

    Returns a future holding ``bucket.buffer()`` averaged over the world size, in its dtype.
    Register with ``ddp.register_comm_hook(state, casync_hook)`` (or :func:`register`).
    """
    return state.submit(bucket.buffer(), state.names_of(bucket.parameters()), bucket.is_last())


# DDP compares the hook's annotations with the real objects; postponed evaluation
# (``from __future__ import annotations``) would leave strings there, so resolve them now.
casync_hook.__annotations__ = {
    "state": CaSyncState,
    "bucket": dist.GradBucket,
    "return": torch.futures.Future[torch.Tensor],
}


def register(
    ddp_model: DistributedDataParallel,
    algorithm: str | CompressionAlgorithm | None = "terngrad",
    params: Mapping[str, Any] | None = None,
    plan: Plan | str | Path | None = None,
    **options: Any,
) -> CaSyncState:
    """Create a :class:`CaSyncState` for ``ddp_model`` and register :func:`casync_hook` on it.

    ``options`` are :class:`CaSyncState`'s keyword arguments (``process_group`` defaults to the
    model's). Call before the first backward. Returns the state (stats, checkpoints).
    """
    if not isinstance(ddp_model, DistributedDataParallel):
        raise CaSyncError(
            f"register needs a DistributedDataParallel model, got {type(ddp_model).__name__}"
        )
    options.setdefault("process_group", ddp_model.process_group)
    named = [(n, p) for n, p in ddp_model.module.named_parameters() if p.requires_grad]
    state = CaSyncState(algorithm, params, named_parameters=named, plan=plan, **options)
    if ddp_model.find_unused_parameters and not ddp_model.static_graph:
        if supported(ddp_model):
            state.watch_unused(ddp_model)
        else:
            logger.warning(
                "casync: this torch's DDP does not say which parameters went unused; with "
                "find_unused_parameters=True, error feedback may lose what it had kept for them"
            )
    ddp_model.register_comm_hook(state, casync_hook)
    return state
