"""One rank's training run of ``hipress bench convergence``
(:mod:`~hipress.bench.convergence`): the task's model and data
(:mod:`~hipress.bench.convergence_tasks`) wrapped and trained, the learning-rate schedule, and
the hand-over of momentum from the optimizer to an algorithm with its own momentum correction
(DGC) when compression starts.

Momentum, once per parameter: SGD's momentum buffer ``b <- m b + g`` and DGC's ``u <- m u + g``
are the same recurrence, so a parameter must go through exactly one of them. Parameters the plan
leaves uncompressed never reach the algorithm and keep the optimizer's momentum throughout.
Compressed ones keep it while CaSync's warm-up sends them uncompressed; at the first compressed
step :func:`hand_over_momentum` copies each one's buffer into the algorithm's ``u`` on every
worker (the buffer is the same on every rank: it is built from averaged gradients) and stops the
optimizer-side momentum (:class:`HeavyBall`) for them. The first compressed step then computes
``u = m b + g_local``, whose mean over ranks is ``m b + mean(g)``, exactly SGD's next buffer:
nothing jumps, and no step runs without momentum.

Clipping, at the same point of the recurrence: SGD clips the gradient and then applies momentum,
so its update's norm stays below ``clip / (1 - m)``. dgc's synchronised gradient already holds
momentum; clipping it at ``clip`` would shrink its steps up to ``1 / (1 - m)`` times whenever
clipping is active, so once dgc runs every update is clipped after momentum, at
``clip / (1 - m)``.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from hipress.bench.convergence_options import (
    TASKS,
    ConvergenceOptions,
    density_schedule,
    fsdp_refusal,
    own_momentum,
)
from hipress.bench.convergence_tasks import RUNNERS
from hipress.bench.powersgd_rows import NAMES as POWERSGD_ROWS
from hipress.bench.powersgd_rows import wrap as wrap_powersgd

if TYPE_CHECKING:
    from hipress.bench.convergence_fsdp import FsdpRun
    from hipress.bench.diloco import Row
    from hipress.casync import CaSyncState

__all__ = [
    "HeavyBall",
    "hand_over_momentum",
    "lr_at",
    "train_rank",
]


def lr_at(opts: ConvergenceOptions, lr: float, step: int, total: int) -> float:
    """The learning rate of ``step`` of ``total``: ``lr``, or with ``opts.lr_schedule`` of
    ``"cosine"`` a cosine decay from ``lr`` to 0 over the run (the same for every
    configuration)."""
    if opts.lr_schedule == "cosine":
        return lr * 0.5 * (1.0 + math.cos(math.pi * step / max(1, total)))
    return lr


class HeavyBall:
    """SGD's momentum (``b <- m b + g``, no dampening, not Nesterov), applied to the gradients
    of ``params`` before a momentum-free ``torch.optim.SGD`` step: the same update as SGD with
    ``momentum=m``, but a parameter's buffer can be handed to the algorithm (:meth:`pop`) and
    its momentum stopped mid-run, which CaSync's optimizer check cannot tell from two momenta
    compounding."""

    def __init__(self, params: list[nn.Parameter], momentum: float) -> None:
        self.momentum = momentum
        self.buffers: dict[nn.Parameter, torch.Tensor | None] = dict.fromkeys(params)

    @torch.no_grad()
    def apply(self) -> None:
        """Replace each tracked gradient with its updated buffer."""
        if self.momentum == 0.0:
            return
        for p, buf in self.buffers.items():
            if p.grad is None:
                continue
            if buf is None:
                buf = self.buffers[p] = p.grad.detach().clone()
            else:
                buf.mul_(self.momentum).add_(p.grad)
            p.grad.copy_(buf)

    def pop(self, p: nn.Parameter) -> torch.Tensor | None:
        """Stop applying momentum to ``p``; returns its buffer (None before the first step)."""
        return self.buffers.pop(p, None)


def hand_over_momentum(
    state: CaSyncState, params: dict[str, nn.Parameter], momentum: HeavyBall
) -> int:
    """Move the momentum buffers of the compressed parameters ``params`` (name -> parameter)
    from ``momentum`` into the algorithm's momentum state ``u`` of every shard this rank
    encodes (its worker states); ``momentum`` no longer applies to them. Call between steps,
    right before the first compressed one. Returns the number of elements handed over."""
    from hipress.core.layout import layout_plan

    layout = layout_plan(state.plan, state.world_size or 1, state.algorithm.payload_nbytes)
    moved = 0
    for name, p in params.items():
        buf = momentum.pop(p)
        if buf is None:
            continue
        flat = buf.reshape(-1)
        for c in layout[name]:
            spans = (
                [(c.key, 0, c.numel)]
                if not c.shards
                else [(c.shard_key(j), *c.shard_span(j)) for j in range(len(c.shards))]
            )
            for key, lo, hi in spans:
                st = state.worker_states.get(key)
                if st is None:  # (RING: a rank's own shard is encoded as the aggregate)
                    continue
                st.tensors["u"].copy_(flat[c.start + lo : c.start + hi])
                moved += hi - lo
    return moved


@dataclass
class _Sync:
    """How one rank's gradients are exchanged: ``model`` is what training calls (DDP, or the
    FSDP2-sharded model), ``state`` CaSync's (DDP with an algorithm), ``sharded`` the FSDP2
    run (FSDP mode), ``eval_model`` the model rank 0 evaluates."""

    model: nn.Module
    eval_model: nn.Module
    state: CaSyncState | None = None
    sharded: FsdpRun | None = None


def _sync(
    model: nn.Module,
    rank: int,
    data: dict[str, Any],
    algorithm: str | None,
    opts: ConvergenceOptions,
    seed: int,
    warmup: int,
    steps_per_epoch: int,
    probe: list[torch.Tensor] | None = None,
) -> _Sync:
    """Wrap ``model``: FSDP2 (compressed by ``algorithm``, paused for the ``warmup`` steps)
    with ``opts.fsdp``, else DDP with CaSync running ``algorithm`` (none for None), or with
    ``probe`` (this rank's first batches) CaSync with the row-sparse plan they measure
    (:func:`~hipress.bench.convergence_rows.probed_plan`; ``algorithm`` None: lossless).
    Raises ValueError for an algorithm FSDP mode refuses."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    if opts.fsdp:
        from hipress.bench.convergence_fsdp import shard

        name, _, feedback = (algorithm or "").partition(":")
        why = fsdp_refusal(name, opts) if algorithm is not None else None
        if why is not None:
            raise ValueError(why)
        # rank 0 evaluates a plain copy, filled from the shards after every epoch
        setup = RUNNERS[opts.task].setup
        eval_model = setup(data, opts, seed)["model"] if rank == 0 else model
        sharded = shard(model, opts.task, name or None, feedback or opts.fsdp_feedback, seed)
        if warmup > 0:
            sharded.pause()
        return _Sync(model, eval_model, sharded=sharded)
    if algorithm in POWERSGD_ROWS:  # hipress's multi-round PowerSGD, or PyTorch's hook
        return _Sync(wrap_powersgd(model, algorithm, warmup), model)
    plan: Any = opts.plan
    if probe is not None:  # (on the bare model, before DDP wraps it)
        from hipress.bench.convergence_rows import probed_plan

        plan = probed_plan(model, algorithm, probe, RUNNERS[opts.task].loss)
    ddp = DDP(model)
    if algorithm is None and probe is None:
        return _Sync(ddp, model)
    import hipress.casync

    state = hipress.casync.register(
        ddp, algorithm=algorithm, plan=plan, warmup_steps=warmup, seed=seed,
        include=list(opts.include) or None,
        params_schedule=[] if algorithm is None else density_schedule(
            algorithm, opts.density_warmup_epochs, steps_per_epoch, start=warmup
        ),
    )  # fmt: skip
    return _Sync(ddp, model, state=state)


def _momentum(
    model: nn.Module, algorithm: str | None, opts: ConvergenceOptions, state: CaSyncState | None
) -> tuple[HeavyBall, dict[str, nn.Parameter], bool]:
    """The optimizer-side momentum, the compressed parameters whose momentum the algorithm
    takes over when compression starts (name -> parameter), and whether the algorithm keeps
    a momentum of its own."""
    own = algorithm not in (None, *POWERSGD_ROWS) and own_momentum(algorithm.partition(":")[0])
    handed: dict[str, nn.Parameter] = {}
    if own and state is not None:
        named = dict(model.named_parameters())
        handed = {e.name: named[e.name] for e in state.plan.entries if e.compress}
    # every parameter starts with the optimizer's momentum; dgc's compressed ones lose it to
    # the algorithm when compression starts (at once without a warm-up)
    momentum = HeavyBall(list(model.parameters()), opts.momentum)
    if own and not opts.momentum_handover:  # the old way, for comparison: no momentum but dgc's
        momentum, handed = HeavyBall([], 0.0), {}
    return momentum, handed, own


def _clip(params: Any, momentum: HeavyBall, clip: float, m: float, after: bool) -> None:
    """Apply ``momentum`` to the gradients and clip their norm at ``clip`` (none at 0): before
    momentum, or with ``after`` (the synchronised gradient already holds the algorithm's
    momentum) after it, at ``clip / (1 - m)``."""
    if after:
        # the synchronised gradient of dgc's parameters already holds momentum: clip every
        # update after momentum, at the bound momentum of clipped gradients reaches,
        # clip / (1 - m), so clipping caps the same thing as without dgc
        momentum.apply()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(params, clip / (1 - m))
        return
    if clip > 0:
        torch.nn.utils.clip_grad_norm_(params, clip)
    momentum.apply()


def _evaluate(sync: _Sync, rank: int, valid: torch.Tensor, task: str) -> tuple[float, float] | None:
    """Rank 0's (accuracy, loss) on ``valid`` (None on the other ranks); in FSDP mode every
    rank takes part in gathering the full parameters."""
    if sync.sharded is not None:
        sync.sharded.gather(sync.eval_model if rank == 0 else None)
    if rank != 0:  # the others wait in the next step's first collective
        return None
    sync.eval_model.eval()
    point = RUNNERS[task].evaluate(sync.eval_model, valid)
    sync.eval_model.train()
    return point  # type: ignore[no-any-return]


def _result(
    sync: _Sync,
    rank: int,
    seconds: float,
    losses: list[float],
    curve: list[tuple[float, float]],
    momentum: tuple[float, int],
) -> dict[str, Any]:
    """:func:`train_rank`'s figures; ``momentum``: the optimizer's momentum on the compressed
    parameters once compression runs, and the elements handed over to the algorithm."""
    out: dict[str, Any] = {
        "seconds": seconds,
        "steps": len(losses),
        "train_loss": losses[-1],
        "optimizer_momentum": momentum[0],
        "momentum_handed_over": momentum[1],
    }
    if sync.sharded is not None:
        out["units"] = sync.sharded.units()
        if sync.sharded.comp is not None:
            out["feedback"] = sync.sharded.comp.feedback
    if rank == 0:
        acc, vloss = curve[-1]
        best = max(range(len(curve)), key=lambda e: curve[e][0])
        out.update(
            accuracy=acc,
            valid_loss=vloss,
            epoch_accuracy=[a for a, _ in curve],
            epoch_valid_loss=[v for _, v in curve],
            best_accuracy=curve[best][0],
            best_epoch=best + 1,
            finite=bool(all(torch.isfinite(p).all() for p in sync.eval_model.parameters())),
        )
    return out


def _setup(
    model: nn.Module, rank: int, world_size: int, data: dict[str, Any], algorithm: str | None,
    opts: ConvergenceOptions, seed: int, warmup: int, steps_per_epoch: int, lr: float,
    local: Row | None, addresses: list[str] | None, probe: list[torch.Tensor] | None = None,
) -> tuple[_Sync, Any, HeavyBall, dict[str, nn.Parameter], bool, Any]:  # fmt: skip
    """The wrapped model, the optimizer to step, the optimizer-side momentum, the parameters
    whose momentum an algorithm takes over, whether it has its own, and the context to train
    in (a local-step variant's, :mod:`~hipress.bench.convergence_local`)."""
    if local is not None:
        from hipress.bench.convergence_local import setup_local

        module, opt, ctx = setup_local(model, local, opts, lr, rank, world_size, addresses)
        return _Sync(module, model), opt, HeavyBall([], 0.0), {}, False, ctx
    sync = _sync(model, rank, data, algorithm, opts, seed, warmup, steps_per_epoch, probe)
    momentum, handed, own = _momentum(model, algorithm, opts, sync.state)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.0)
    return sync, opt, momentum, handed, own, contextlib.nullcontext()


def _order(n: int, epoch: int, seed: int) -> torch.Tensor:
    """The order of the ``n`` training samples in ``epoch`` (the same on every rank)."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(epoch + 1000 * seed))


def _probe(
    train: torch.Tensor, seed: int, per_step: int, rank: int, world_size: int
) -> list[torch.Tensor]:
    """This rank's first batches of the first epoch, which the row-sparse probe measures."""
    from hipress.bench.convergence_rows import PROBE_STEPS

    first = _order(len(train), 0, seed)
    steps = min(PROBE_STEPS, len(train) // per_step)
    return [train[first[s * per_step : (s + 1) * per_step][rank::world_size]] for s in range(steps)]


def train_rank(
    rank: int,
    world_size: int,
    data: dict[str, Any],
    algorithm: str | None,
    opts: ConvergenceOptions,
    seed: int,
    local: Row | None = None,
    addresses: list[str] | None = None,
    rows: bool = False,
) -> dict[str, Any]:
    """Train ``opts.task`` on this rank with ``algorithm`` (None: uncompressed) from seed
    ``seed`` (the weights, the batch order and CaSync's RNG) under DDP, or with ``opts.fsdp``
    under FSDP2 (``algorithm`` may then be ``"name:feedback"``); rank 0 evaluates after every
    epoch. Raises ValueError for an algorithm FSDP mode refuses. Returns ``seconds``
    (training only), ``steps``, ``train_loss``, ``optimizer_momentum`` (of the compressed
    parameters once compression runs) and ``momentum_handed_over`` (elements), under FSDP2
    ``units`` (name -> [padded elements, compressed], None for plain FSDP2) and ``feedback``,
    and on rank 0 the accuracy curve and its summary; ``losses`` and ``elapsed`` (training
    seconds) after each step. With ``local`` (a local-step row), that variant trains instead
    (``algorithm`` None); ``addresses``: each rank's network address (torchft's servers).
    With ``rows``, the embeddings are synchronised as their touched rows
    (:mod:`~hipress.bench.convergence_rows`; ``algorithm`` None: lossless), and the result
    holds the plan's ``row_sparse`` entries."""
    spec = TASKS[opts.task]
    task = RUNNERS[opts.task].setup(data, opts, seed)
    model: nn.Module = task["model"]
    train, valid, loss_fn = task["train"], task["valid"], RUNNERS[opts.task].loss
    per_step = world_size * (opts.batch or spec.batch)
    steps_per_epoch = len(train) // per_step
    warmup = opts.warmup_steps + round(opts.warmup_epochs * steps_per_epoch)
    lr = opts.lr or spec.lr
    probe = _probe(train, seed, per_step, rank, world_size) if rows else None
    sync, opt, momentum, handed, own, ctx = _setup(
        model, rank, world_size, data, algorithm, opts, seed, warmup, steps_per_epoch, lr,
        local, addresses, probe,
    )  # fmt: skip
    clip = spec.clip if opts.clip is None else opts.clip
    moved, total = 0, opts.epochs * steps_per_epoch
    losses: list[float] = []
    elapsed: list[float] = []
    curve: list[tuple[float, float]] = []  # rank 0: (accuracy, loss) after each epoch
    t0, t_eval, step = time.perf_counter(), 0.0, 0
    epochs = opts.local_epochs if local is not None and opts.local_epochs else opts.epochs
    with ctx:  # a local-step variant's outer syncs run in its context
        for epoch in range(epochs):
            order = _order(len(train), epoch, seed)
            for s in range(steps_per_epoch):
                if handed and step == warmup:
                    assert sync.state is not None
                    moved = hand_over_momentum(sync.state, handed, momentum)
                if sync.sharded is not None and step == warmup:
                    sync.sharded.resume()
                for g in opt.param_groups:
                    g["lr"] = lr_at(opts, lr, step, total)
                batch = train[order[s * per_step : (s + 1) * per_step][rank::world_size]]
                loss = loss_fn(sync.model, batch)
                opt.zero_grad(set_to_none=False)
                loss.backward()
                after = bool(handed) and step >= warmup
                _clip(sync.model.parameters(), momentum, clip, opts.momentum, after)
                opt.step()
                losses.append(float(loss.detach()))
                elapsed.append(time.perf_counter() - t0 - t_eval)
                step += 1
            t = time.perf_counter()  # (evaluated at DDP's tokens, not after a longer run)
            point = _evaluate(sync, rank, valid, opts.task) if epoch < opts.epochs else None
            if point is not None:
                curve.append(point)
            t_eval += time.perf_counter() - t
    seconds = time.perf_counter() - t0 - t_eval
    dist.barrier()
    out = _result(sync, rank, seconds, losses, curve, (0.0 if own else opts.momentum, moved))
    if rows and sync.state is not None:
        from hipress.bench.convergence_rows import row_entries

        out["row_sparse"] = row_entries(sync.state)
    return {**out, "losses": losses, "elapsed": elapsed}
