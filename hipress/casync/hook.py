"""The CaSync DDP communication hook and :func:`register` (the state object it runs over:
:class:`~hipress.casync.state.CaSyncState`).

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

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from hipress.casync.buckets import check_buckets
from hipress.casync.optimizers import check_optimizer, watch_optimizers
from hipress.casync.state import CaSyncState
from hipress.casync.unused import supported
from hipress.codec.errors import CaSyncError
from hipress.codec.logs import RANK_FILTER
from hipress.codec.planning import DEFAULT_ALGORITHM
from hipress.core.compression import CompressionAlgorithm
from hipress.core.plan import Plan
from hipress.core.rule import Selection, Shapes, embedding_names

__all__ = ["CaSyncState", "casync_hook", "register", "selection_for"]

logger = logging.getLogger(__name__)
logger.addFilter(RANK_FILTER)


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


def selection_for(
    model: torch.nn.Module,
    include: str | Sequence[str] | None,
    exclude: str | Sequence[str] | None,
    shapes: Shapes,
) -> Selection:
    """The :class:`~hipress.core.rule.Selection` of ``include``/``exclude``/``shapes`` for
    ``model`` (its embedding weights found by module type). Raises :class:`CaSyncError` naming
    the argument that is wrong."""
    try:
        return Selection(include or (), exclude or (), shapes, embedding_names(model))
    except ValueError as exc:
        raise CaSyncError(str(exc)) from None


def register(
    ddp_model: DistributedDataParallel,
    algorithm: str | CompressionAlgorithm | None = DEFAULT_ALGORITHM,
    *,
    params: Mapping[str, Any] | None = None,
    plan: Plan | str | Path | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    include: str | Sequence[str] | None = None,
    exclude: str | Sequence[str] | None = None,
    shapes: Shapes = "all",
    **options: Any,
) -> CaSyncState:
    """Create a :class:`CaSyncState` for ``ddp_model`` and register :func:`casync_hook` on it.

    Everything after ``algorithm`` is keyword-only: ``params`` (the algorithm's
    hyper-parameters, a dict), ``plan``, ``optimizer`` and ``options``, :class:`CaSyncState`'s
    keyword arguments (``process_group`` defaults to the model's). Call before the first
    backward. Returns the state (stats, checkpoints).

    ``include``, ``exclude`` and ``shapes`` say which parameters may be compressed at all
    (:class:`~hipress.core.rule.Selection`; patterns match ``module.named_parameters()``
    names): ``exclude`` keeps the parameters it matches plain, ``shapes="matrices"`` keeps
    every tensor without exactly two dimensions plain (a callable ``(name, shape) -> bool``
    decides otherwise), and the default rule and ``plan="auto"`` also keep the model's
    embedding weights (``nn.Embedding``/``nn.EmbeddingBag``, by module type) and 1-D tensors
    plain unless ``include`` matches them. A pattern that matches no parameter needing a
    gradient raises :class:`CaSyncError` (with the names it may have meant).

    Some algorithms cannot train with some optimizers (dgc's own momentum on top of the
    optimizer's compounds the two): given the ``optimizer``, such a combination raises
    :class:`CaSyncError` here, with what to change; without it, at the first ``step()`` of an
    optimizer that updates this model's parameters.
    """
    if not isinstance(ddp_model, DistributedDataParallel):
        raise CaSyncError(
            f"register needs a DistributedDataParallel model, got {type(ddp_model).__name__}"
        )
    options.setdefault("process_group", ddp_model.process_group)
    named = [(n, p) for n, p in ddp_model.module.named_parameters() if p.requires_grad]
    options["selection"] = selection_for(ddp_model.module, include, exclude, shapes)
    state = CaSyncState(algorithm, params=params, named_parameters=named, plan=plan, **options)
    if state.multi_round:  # (PowerSGD keeps error feedback: no optimizer to refuse)
        pass
    elif optimizer is not None:
        try:
            check_optimizer(state.algorithm, optimizer)
        except CaSyncError:
            state.close()
            raise
    else:
        watch_optimizers(state.algorithm, [p for _, p in named])
    if ddp_model.find_unused_parameters and not ddp_model.static_graph:
        if supported(ddp_model):
            state.watch_unused(ddp_model)
        else:
            logger.warning(
                "casync: this torch's DDP does not say which parameters went unused; with "
                "find_unused_parameters=True, error feedback may lose what it had kept for them"
            )
    # a large gradient ready last holding back earlier ones that send many bytes
    check_buckets(ddp_model, named, state.wire_nbytes())
    ddp_model.register_comm_hook(state, casync_hook)
    return state
