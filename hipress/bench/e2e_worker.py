"""One worker of ``hipress bench e2e`` (:mod:`hipress.bench.e2e`): the model wrapped as a
:class:`~hipress.bench.e2e_configs.Config` says (DDP with PyTorch's hook, or CaSync), trained for
the warm-up and the timed steps, with what the rank measured: seconds, bytes on its NIC, losses,
its step timeline, when each gradient was ready (compute only) and CaSync's plan."""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from hipress.bench.e2e_configs import Config
from hipress.bench.netsim import tx_bytes
from hipress.bench.tail import ReadyClock
from hipress.bench.workloads import WORKLOADS
from hipress.casync.trace import Tracer

__all__ = ["train", "wrap"]


def wrap(
    model: torch.nn.Module, cfg: Config, bucket_view: bool = True, probe: Any = ()
) -> tuple[torch.nn.Module, Any]:
    """``model`` ready to train as ``cfg`` says: itself (compute only), or DDP (with
    ``gradient_as_bucket_view=bucket_view``) with PyTorch's hook or CaSync's. Returns the module
    and CaSync's state (None but for hipress, whose plan is made here)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    from torch.nn.parallel import DistributedDataParallel as DDP

    if cfg.kind == "compute":
        return model, None
    plan: Any = cfg.plan
    if cfg.rows:  # (probe: backward steps on the bare model, see hipress.casync.rowsparse)
        from hipress.casync.rowsparse import probe_plan

        plan = probe_plan(model, probe, cfg.algorithm)
    kw = {} if cfg.bucket_cap_mb is None else {"bucket_cap_mb": cfg.bucket_cap_mb}
    ddp = DDP(model, gradient_as_bucket_view=bucket_view, **kw)  # type: ignore[arg-type]
    if cfg.kind == "rounds":  # (compressing from step 0, as the other hipress rows: rows
        import hipress.casync  # counted in step 0, plan checked at step 5, all in the warm-up)

        params = {"rank": cfg.powersgd_rank}
        state = hipress.casync.register(ddp, cfg.algorithm or "", params=params)
        return ddp, state  # (its plan and each round's bytes: the row's network floor)
    if cfg.kind == "hipress":
        import hipress.casync

        _check_include(cfg.include, model)
        state = hipress.casync.register(ddp, algorithm=cfg.algorithm, plan=plan,
                                        include=list(cfg.include) or None)  # fmt: skip
        _ = state.plan  # plan="auto" plans here, in the set-up, rather than in the first step
        return ddp, state
    if cfg.hook == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif cfg.hook == "powersgd":
        state = psgd.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=cfg.powersgd_rank,
            start_powerSGD_iter=2,
            use_error_feedback=True,
            warm_start=True,
        )
        ddp.register_comm_hook(state, psgd.powerSGD_hook)
    elif cfg.hook == "noop":  # DDP's own cost: buckets and hooks, no gradient exchange
        ddp.register_comm_hook(None, _noop_hook)
    elif cfg.hook == "sync":  # a step's synchronisation with no bytes to move
        ddp.register_comm_hook(None, _sync_hook)
    elif cfg.hook != "allreduce":
        raise ValueError(f"unknown DDP hook {cfg.hook!r}")
    return ddp, None


def _check_include(include: tuple[str, ...], model: torch.nn.Module) -> None:
    """Raises ValueError where a pattern of ``include`` names no parameter of ``model`` (its
    row would be its plain twin under another name)."""
    from hipress.core.rule import Selection

    names = [n for n, _ in model.named_parameters()]
    idle = [p for _, p in Selection(include=include).unmatched(names)]
    if idle:
        raise ValueError(f"include: {idle} match no parameter of the model (its parameters: "
                         f"{', '.join(names[:8])}{', ...' if len(names) > 8 else ''})")  # fmt: skip


def _noop_hook(_: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def _sync_hook(_: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    buf = bucket.buffer()
    work = dist.all_reduce(torch.zeros(1), async_op=True)
    return work.get_future().then(lambda _f: buf)


# DDP checks the hook's annotations against the real types (postponed evaluation leaves strings)
_noop_hook.__annotations__ = {
    "_": Any, "bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor],
}  # fmt: skip
_sync_hook.__annotations__ = _noop_hook.__annotations__


def train(
    rank: int,
    world_size: int,
    model_name: str,
    data: Any,
    cfg: Config,
    warmup: int,
    steps: int,
    lr: float,
    iface: str,
    trace: str | None = None,
    bucket_view: bool = True,
) -> dict[str, Any]:
    """One worker's run of ``cfg`` (collective: every rank calls it): ``warmup`` steps, then
    ``steps`` timed ones, on the interface ``iface`` whose transmit counter it reads; with
    ``trace`` (a path with ``{rank}``) the timed steps' timeline is written there. Returns
    ``seconds``, ``setup_s``, ``tx_bytes``, ``losses`` and ``trace``; compute only also
    ``grad_ready_lead_ms``, hipress also CaSync's figures and plan."""
    w = WORKLOADS[model_name]
    t_setup = time.perf_counter()
    probe = [lambda m, s=s: w.loss(m, *w.batch(data, rank, s)).backward() for s in range(3)]
    model, state = wrap(w.build(data), cfg, bucket_view, probe)
    setup_s = time.perf_counter() - t_setup
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    batches = [w.batch(data, rank, s) for s in range(warmup + steps)]
    losses: list[float] = []
    tracer = state.tracer if state is not None else Tracer(rank)
    # compute only (nothing delays backward): when each gradient is ready (hipress.bench.tail)
    clock = ReadyClock(model) if cfg.kind == "compute" else None

    def step(i: int) -> None:
        x, y = batches[i]
        with tracer.span("step", "step"):
            opt.zero_grad(set_to_none=False)
            with tracer.span("forward", "compute"):
                loss = w.loss(model, x, y)
            with tracer.span("backward", "compute"):
                loss.backward()
            if clock is not None:
                clock.step_done()
            with tracer.span("optimizer", "compute"):
                opt.step()
            losses.append(float(loss.detach()))

    for i in range(warmup):
        step(i)
    dist.barrier()
    if trace is not None:  # the timed steps' timeline
        tracer.record(trace, steps=None, config=cfg.name, model=model_name)
    tx0 = tx_bytes(iface)
    if clock is not None:
        clock.on = True
    t0 = time.perf_counter()
    for i in range(warmup, warmup + steps):
        step(i)
    seconds = time.perf_counter() - t0
    tx1 = tx_bytes(iface)
    written = tracer.stop()
    dist.barrier()
    out: dict[str, Any] = {
        "seconds": seconds,
        "setup_s": setup_s,
        "tx_bytes": None if tx0 is None or tx1 is None else tx1 - tx0,
        "losses": losses,
        "trace": None if written is None else str(written),
    }
    if clock is not None:
        out["grad_ready_lead_ms"] = clock.leads()
    if state is not None:
        out.update(_casync_figures(state, model))
    return out


def _casync_figures(state: Any, model: torch.nn.Module) -> dict[str, Any]:
    """CaSync's mean step figures and its plan, as a row of results holds them: a row-sparse
    entry also holds its ``rows``, ``row_bound`` and the rows of the last step's synchronised
    gradient that are not zero (the union of the ranks' rows, as sent)."""
    grads = {n: p.grad for n, p in getattr(model, "module", model).named_parameters()}

    def union(name: str, rows: int) -> int | None:
        g = grads.get(name)
        return None if g is None else int(g.reshape(rows, -1).ne(0).any(1).sum())

    return {
        "casync": state.stats.mean(),
        "compressed_tensors": sum(e.compress for e in state.plan.entries),
        "tensors": len(state.plan.entries),
        "plan": {
            "digest": state.plan.digest(),
            "entries": [
                [e.name, e.numel, e.compress, e.strategy.value, e.partitions]
                + ([e.rows, e.row_bound, union(e.name, e.rows)] if e.row_bound else [])
                for e in state.plan.entries
            ],
            "totals": dict(state.plan.totals),
            "selection": state.plan.meta.get("selection"),
            **_round_bytes(state, model),
        },
    }


def _round_bytes(state: Any, model: torch.nn.Module) -> dict[str, Any]:
    """``round_bytes``: each rounds entry's payload bytes per round (a multi-round state)."""
    if not getattr(state, "multi_round", False):
        return {}
    shapes = {n: tuple(p.shape) for n, p in getattr(model, "module", model).named_parameters()}
    return {"round_bytes": {e.name: state.algorithm.round_nbytes(shapes[e.name])
                            for e in state.plan.entries if e.strategy.value == "rounds"}}  # fmt: skip
