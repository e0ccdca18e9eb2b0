"""One rank's training run of ``hipress bench convergence``
(:mod:`~hipress.bench.convergence`): the tasks (a word-level LSTM LM, a tabular classifier),
the learning-rate schedule, and the hand-over of momentum from the optimizer to an algorithm
with its own momentum correction (DGC) when compression starts.

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

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from hipress.bench.workloads import LSTMLM, TabularMLP

if TYPE_CHECKING:
    from hipress.bench.convergence import ConvergenceOptions
    from hipress.bench.convergence_fsdp import FsdpRun
    from hipress.casync import CaSyncState

__all__ = [
    "TASKS",
    "HeavyBall",
    "TaskSpec",
    "fsdp_refusal",
    "hand_over_momentum",
    "lr_at",
    "train_rank",
]


@dataclass(frozen=True)
class TaskSpec:
    """A convergence task's defaults: ``lr``, ``batch`` (samples per rank per step), ``clip``
    and a one-line ``description`` for the results."""

    lr: float
    batch: int
    clip: float
    description: str


TASKS: dict[str, TaskSpec] = {
    "lm": TaskSpec(0.5, 8, 1.0, "word-level LSTM LM (adaptive softmax) on Python stdlib sources"),
    "tabular": TaskSpec(
        0.05, 32, 1.0, "MLP classifier (32-2048-256-10) on a synthetic teacher-student task"
    ),
}


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


def _lm_setup(data: dict[str, Any], opts: ConvergenceOptions, seed: int) -> dict[str, Any]:
    def windows(ids: torch.Tensor) -> torch.Tensor:
        n = (len(ids) - 1) // opts.bptt
        return torch.stack([ids[i * opts.bptt : i * opts.bptt + opts.bptt + 1] for i in range(n)])

    torch.manual_seed(seed)
    model = LSTMLM(data["vocab"], emb=128, hidden=256, layers=1, cutoffs=(1000, 4000))
    return {"model": model, "train": windows(data["train"]), "valid": windows(data["valid"])}


def _lm_loss(ddp: nn.Module, chunk: torch.Tensor) -> torch.Tensor:
    return ddp(chunk[:, :-1], chunk[:, 1:])  # type: ignore[no-any-return]


@torch.no_grad()
def _lm_eval(model: LSTMLM, windows: torch.Tensor) -> tuple[float, float]:
    correct = total = 0
    loss_sum = 0.0
    for chunk in windows.split(64):
        x, y = chunk[:, :-1], chunk[:, 1:]
        correct += int((model.predict(x) == y).sum())
        loss_sum += float(model(x, y)) * y.numel()
        total += y.numel()
    return correct / total, loss_sum / total


def _tab_setup(data: dict[str, Any], opts: ConvergenceOptions, seed: int) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = TabularMLP(data["features"], data["classes"])
    train = torch.cat([data["train_x"], data["train_y"][:, None].float()], 1)
    valid = torch.cat([data["valid_x"], data["valid_y"][:, None].float()], 1)
    return {"model": model, "train": train, "valid": valid}


def _tab_loss(ddp: nn.Module, chunk: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(ddp(chunk[:, :-1]), chunk[:, -1].long())


@torch.no_grad()
def _tab_eval(model: TabularMLP, valid: torch.Tensor) -> tuple[float, float]:
    logits, y = model(valid[:, :-1]), valid[:, -1].long()
    acc = float((logits.argmax(1) == y).float().mean())
    return acc, float(nn.functional.cross_entropy(logits, y))


_RUNNERS = {"lm": (_lm_setup, _lm_loss, _lm_eval), "tabular": (_tab_setup, _tab_loss, _tab_eval)}


def train_rank(
    rank: int,
    world_size: int,
    data: dict[str, Any],
    algorithm: str | None,
    opts: ConvergenceOptions,
    seed: int,
) -> dict[str, Any]:
    """Train ``opts.task`` on this rank with ``algorithm`` (None: uncompressed) from seed
    ``seed`` (the weights, the batch order and CaSync's RNG) under DDP, or with ``opts.fsdp``
    under FSDP2 (``algorithm`` may then be ``"name:feedback"``); rank 0 evaluates after every
    epoch. Raises ValueError for an algorithm FSDP mode refuses. Returns ``seconds``
    (training only), ``steps``, ``train_loss``, ``optimizer_momentum`` (of the compressed
    parameters once compression runs) and ``momentum_handed_over`` (elements), under FSDP2
    ``units`` (name -> [padded elements, compressed], None for plain FSDP2) and ``feedback``,
    and on rank 0 the accuracy curve and its summary."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    setup, loss_fn, evaluate = _RUNNERS[opts.task]
    task = setup(data, opts, seed)
    model: nn.Module = task["model"]
    train, valid = task["train"], task["valid"]
    batch = opts.batch or TASKS[opts.task].batch
    per_step = world_size * batch
    steps_per_epoch = len(train) // per_step
    warmup = opts.warmup_steps + round(opts.warmup_epochs * steps_per_epoch)
    state = None
    sharded: FsdpRun | None = None
    eval_model = model
    if opts.fsdp:
        from hipress.bench.convergence_fsdp import shard

        name, _, feedback = (algorithm or "").partition(":")
        why = fsdp_refusal(name, opts) if algorithm is not None else None
        if why is not None:
            raise ValueError(why)
        # rank 0 evaluates a plain copy, filled from the shards after every epoch
        eval_model = setup(data, opts, seed)["model"] if rank == 0 else model
        sharded = shard(model, opts.task, name or None, feedback or opts.fsdp_feedback, seed)
        if warmup > 0:
            sharded.pause()
        ddp: nn.Module = model
    else:
        ddp = DDP(model)
    if algorithm is not None and not opts.fsdp:
        import hipress.casync

        state = hipress.casync.register(
            ddp, algorithm=algorithm, plan=opts.plan, warmup_steps=warmup, seed=seed,
            params_schedule=density_schedule(
                algorithm, opts.density_warmup_epochs, steps_per_epoch, start=warmup
            ),
        )  # fmt: skip
    own = algorithm is not None and own_momentum(algorithm.partition(":")[0])
    handed: dict[str, nn.Parameter] = {}
    if own and state is not None:
        named = dict(model.named_parameters())
        handed = {e.name: named[e.name] for e in state.plan.entries if e.compress}
    lr = opts.lr or TASKS[opts.task].lr
    clip = TASKS[opts.task].clip if opts.clip is None else opts.clip
    # every parameter starts with the optimizer's momentum; dgc's compressed ones lose it to
    # the algorithm when compression starts (at once without a warm-up)
    momentum = HeavyBall(list(model.parameters()), opts.momentum)
    if own and not opts.momentum_handover:  # the old way, for comparison: no momentum but dgc's
        momentum, handed = HeavyBall([], 0.0), {}
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.0)
    moved = 0
    total = opts.epochs * steps_per_epoch
    losses: list[float] = []
    curve: list[tuple[float, float]] = []  # rank 0: (accuracy, loss) after each epoch
    t0, t_eval, step = time.perf_counter(), 0.0, 0
    for epoch in range(opts.epochs):
        gen = torch.Generator().manual_seed(epoch + 1000 * seed)
        order = torch.randperm(len(train), generator=gen)
        for s in range(steps_per_epoch):
            if handed and step == warmup:
                assert state is not None
                moved = hand_over_momentum(state, handed, momentum)
            if sharded is not None and step == warmup:
                sharded.resume()
            for g in opt.param_groups:
                g["lr"] = lr_at(opts, lr, step, total)
            loss = loss_fn(ddp, train[order[s * per_step : (s + 1) * per_step][rank::world_size]])
            opt.zero_grad(set_to_none=False)
            loss.backward()
            if handed and step >= warmup:
                # the synchronised gradient of dgc's parameters already holds momentum: clip
                # every update after momentum, at the bound momentum of clipped gradients
                # reaches, clip / (1 - m), so clipping caps the same thing as without dgc
                momentum.apply()
                if clip > 0:
                    torch.nn.utils.clip_grad_norm_(ddp.parameters(), clip / (1 - opts.momentum))
            else:
                if clip > 0:
                    torch.nn.utils.clip_grad_norm_(ddp.parameters(), clip)
                momentum.apply()
            opt.step()
            losses.append(float(loss.detach()))
            step += 1
        t = time.perf_counter()
        if sharded is not None:  # every rank takes part in gathering the full parameters
            sharded.gather(eval_model if rank == 0 else None)
        if rank == 0:  # the others wait in the next step's first collective
            eval_model.eval()
            curve.append(evaluate(eval_model, valid))
            eval_model.train()
        t_eval += time.perf_counter() - t
    seconds = time.perf_counter() - t0 - t_eval
    dist.barrier()
    out: dict[str, Any] = {
        "seconds": seconds,
        "steps": len(losses),
        "train_loss": losses[-1],
        # the optimizer's momentum on the compressed parameters once compression runs
        "optimizer_momentum": 0.0 if own else opts.momentum,
        "momentum_handed_over": moved,
    }
    if sharded is not None:
        out["units"] = sharded.units()
        if sharded.comp is not None:
            out["feedback"] = sharded.comp.feedback
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
            finite=bool(all(torch.isfinite(p).all() for p in eval_model.parameters())),
        )
    return out


_DENSITY_PARAMS = {
    "s_percent": lambda d: d,
    "ratio": lambda d: d,
    "drop_ratio": lambda d: 1.0 - d,
}


def density_schedule(
    name: str, epochs: int, steps_per_epoch: int, start: int = 0
) -> list[tuple[int, dict[str, float]]]:
    """DGC's warm-up (Lin et al. 2018) for sparsifier ``name`` as a CaSync ``params_schedule``:
    in epoch e < ``epochs`` of compression (which starts at step ``start``, after CaSync's
    uncompressed warm-up) it sends a fraction ``max(own, 0.25 / 4**e)`` of the elements (75%,
    93.75%, 98.4375%, 99.6% sparsity ...), from epoch ``epochs`` on its own fraction. Empty for
    an algorithm without a fraction parameter (``s_percent``, ``ratio``, ``drop_ratio``) or
    with ``epochs`` 0."""
    from hipress.compll import load

    params = load(name, backend="reference").params
    key = next((k for k in _DENSITY_PARAMS if k in params), None)
    if key is None or epochs <= 0:
        return []
    to_value = _DENSITY_PARAMS[key]
    own = float(params[key]) if key != "drop_ratio" else 1.0 - float(params[key])
    schedule: list[tuple[int, dict[str, float]]] = []
    for e in range(epochs + 1):
        value = to_value(max(own, 0.25 / 4**e) if e < epochs else own)
        if not schedule or schedule[-1][1][key] != value:  # no entry that changes nothing
            schedule.append((start + e * steps_per_epoch, {key: value}))
    return schedule


def own_momentum(name: str) -> bool:
    """Whether algorithm ``name`` keeps a momentum of its own (a ``momentum`` parameter > 0)."""
    from hipress.compll import load

    return float(load(name, backend="reference").params.get("momentum", 0.0)) > 0.0


def fsdp_refusal(algorithm: str, opts: ConvergenceOptions) -> str | None:
    """Why ``algorithm`` cannot run in FSDP mode with ``opts`` (None: it can). Refused: an
    algorithm with its own momentum under the momentum hand-over, and a sparsifier under a
    density warm-up; both need CaSync's state, which FSDP mode does not have."""
    if opts.momentum_handover and own_momentum(algorithm):
        return (
            f"{algorithm} keeps its own momentum, which takes over the optimizer's through "
            "CaSync's state when compression starts; FSDP mode has no such hand-over: run "
            f"{algorithm} without --fsdp"
        )
    if density_schedule(algorithm, opts.density_warmup_epochs, 1):
        return (
            f"{algorithm}'s density warm-up (--density-warmup-epochs "
            f"{opts.density_warmup_epochs}) switches its parameters through CaSync's "
            "params_schedule, which FSDP mode does not have: pass --density-warmup-epochs 0 "
            "to run it at its own density from the first compressed step"
        )
    return None
