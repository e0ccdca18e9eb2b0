"""Local-step training: :class:`DiLoCo`, H inner steps of the user's optimizer alone, then the
workers average the change of their weights (the outer gradient), compressed with any CompLL
algorithm with error feedback, and an outer optimizer applies it.

Every rank keeps the anchor weights (the last global weights). At a fragment's sync, each rank's
outer gradient is ``anchor - local``; :class:`~hipress.diloco.sync.FragmentSync` averages it
over the process group (the same bits on every rank); the parameters are set to the anchor,
their ``.grad`` to the mean, the outer optimizer steps, and the result is the new anchor and
(mixed with the local weights by ``fragment_update_alpha``) the new local weights. Which
fragment syncs when, and how long its collective may overlap inner steps, is
:class:`~hipress.diloco.fragments.Schedule`'s. Every rank issues the same collectives in the
same order by construction: they follow from the inner step count alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hipress.codec.algorithm import chunk_tensor_id, rank_seed
from hipress.codec.logs import RANK_FILTER
from hipress.core.compression import CompressionAlgorithm
from hipress.core.release import settle_at_exit
from hipress.diloco import checkpoint, setup, shards
from hipress.diloco.auto import auto_plan
from hipress.diloco.coder import OuterCoder, resolve_feedback
from hipress.diloco.config import Choice, describe, digest, resolve_codecs
from hipress.diloco.errors import DiLoCoError
from hipress.diloco.fragments import Fragments, Schedule, split_fragments
from hipress.diloco.stats import DiLoCoStats
from hipress.diloco.sync import FragmentSync, Pending
from hipress.secopa.model.profile import Profile

__all__ = ["DiLoCo", "DiLoCoStats"]

log = logging.getLogger(__name__)
log.addFilter(RANK_FILTER)


class DiLoCo:
    """Local-step training of ``model`` (see the module's description and
    docs/reference/diloco-api.md).

    Args:
        model: the module trained (its trainable parameters are averaged; buffers stay local);
            plain or FSDP2-sharded (``fully_shard`` over the replica's ranks) throughout.
        inner_optimizer: the optimizer the training loop steps (over the model's parameters).
        sync_every: H, inner steps between two syncs of a fragment.
        algorithm: the outer gradient's codec: a CompLL name, an algorithm object,
            ``None``/``"none"`` (uncompressed), or a mapping from parameter name to one of
            those.
        params: the algorithm's parameters (with a name).
        outer_optimizer: an optimizer over exactly the model's trainable parameters (default:
            SGD, lr 0.7, momentum 0.9, Nesterov; where a tensor's codec keeps error feedback,
            SGD, lr 1.0, momentum 0.5, Nesterov).
        fragments: a count, or a list of modules or parameter lists (Streaming DiLoCo).
        fragment_sync_delay: tau, inner steps a fragment's collective overlaps (< H / F).
        fragment_update_alpha: weight of the local weights when mixed with the new global ones
            (0: take the global ones).
        feedback: ``"auto"``, ``"fp32"`` or ``"none"`` (:mod:`hipress.diloco.coder`).
        process_group: the group the outer sync runs over (default: the default group); with
            replicas of several processes (DDP or FSDP2 inside each), the group of this rank's
            peers in other replicas; with FSDP2, the peers that hold the same shard
            (:mod:`hipress.diloco.shards`: every state is then per shard).
        seed: base seed of random codecs' streams.
        backend: CompLL backend for algorithm names (``"auto"``, ``"c"``, ``"cuda"``,
            ``"reference"``).
        plan: ``"auto"``: SeCoPa decides per fragment whether ``algorithm`` compresses it or
            it is sent uncompressed (:mod:`hipress.diloco.auto`; :attr:`auto` holds the choices
            and the predicted utilisation at H); None: ``algorithm`` as given.
        profile: the SeCoPa profile ``plan="auto"`` plans with (default: measured in the
            group at construction).
        inner_step_ms: compute per inner step for ``plan="auto"`` (default: timed over the
            first H steps).

    Raises :class:`DiLoCoError` for bad arguments, :class:`ConfigMismatchError` on every rank
    when ranks are configured differently, and :class:`CommError` when a peer is gone. At
    construction every rank takes the weights of the group's first rank.
    """

    def __init__(
        self,
        model: nn.Module,
        inner_optimizer: torch.optim.Optimizer,
        sync_every: int,
        algorithm: Choice | Mapping[str, Choice] = None,
        *,
        params: Mapping[str, Any] | None = None,
        outer_optimizer: torch.optim.Optimizer | None = None,
        fragments: Fragments = 1,
        fragment_sync_delay: int = 0,
        fragment_update_alpha: float = 0.0,
        feedback: str = "auto",
        process_group: Any = None,
        seed: int = 0,
        backend: str = "auto",
        plan: str | None = None,
        profile: Profile | None = None,
        inner_step_ms: float | None = None,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise DiLoCoError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(inner_optimizer, torch.optim.Optimizer):
            raise DiLoCoError(
                f"inner_optimizer must be a torch.optim.Optimizer, got "
                f"{type(inner_optimizer).__name__}"
            )
        if not dist.is_available() or not dist.is_initialized():
            raise DiLoCoError(
                "DiLoCo needs torch.distributed: call dist.init_process_group first (torchrun "
                "does it with the environment it sets)"
            )
        alpha = fragment_update_alpha
        if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 <= alpha <= 1:
            raise DiLoCoError(f"fragment_update_alpha must be in [0, 1], got {alpha!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise DiLoCoError(f"seed must be an integer, got {seed!r}")
        self.model, self.inner = model, inner_optimizer
        self.named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not self.named:
            raise DiLoCoError("the model has no trainable parameter")
        self.sharded = shards.check(self.named)
        setup.check_inner(self.named, inner_optimizer)
        self.group = process_group if process_group is not None else dist.group.WORLD
        self.rank, self.size = dist.get_rank(self.group), dist.get_world_size(self.group)
        self.frags = split_fragments(self.named, fragments)
        self.schedule = Schedule.checked(sync_every, len(self.frags), fragment_sync_delay)
        self.alpha, self.seed = float(alpha), seed
        # with FSDP2, per shard: the rows this rank sends, over the group that sends them
        self.auto = auto_plan(plan, self._rows(), self.frags, self.schedule, algorithm, params,
                              self.group, profile, inner_step_ms, backend)  # fmt: skip
        if self.auto is not None:
            algorithm = self.auto.algorithms
        names = [n for n, _ in self.named]
        rows = [shards.local(p) for _, p in self.named]  # this rank's (all of a plain tensor)
        self.codecs = resolve_codecs(algorithm, params, names, [x.device for x in rows], backend)
        self.feedback = [resolve_feedback(a, feedback) for a in self.codecs]
        self.outer = (outer_optimizer if outer_optimizer is not None
                      else setup.default_outer(self.named, self.feedback))  # fmt: skip
        setup.check_outer(self.named, self.outer, inner_optimizer)
        self.config_lines = describe(names, [tuple(x.shape) for x in rows], self.codecs,
                                     self.feedback, self.frags, self._options())  # fmt: skip
        self.config = digest(self.config_lines)
        settle_at_exit()  # collectives from here on: let their backend's threads finish at exit
        setup.agree(self.group, self.config, self.config_lines, shards.layout(self.named))
        setup.broadcast_weights(self.named, self.group)
        self.coders = self._make_coders()
        self.syncs = [self._fragment_sync(k) for k in range(len(self.frags))]
        self.anchors = [x.clone() for x in rows]
        self.pending: list[Pending | None] = [None] * len(self.frags)
        self.stats = DiLoCoStats(per_fragment=[0] * len(self.frags))
        self._hook: Any = None

    # ---- checks at construction ---------------------------------------------------------------

    def _options(self) -> dict[str, Any]:
        # foreach changes how the optimizer runs, not what it computes: described as torch's
        # default, so a checkpoint of a run whose optimizer had another keeps its digest
        groups = [{k: None if k == "foreach" else v for k, v in g.items() if k != "params"}
                  for g in self.outer.param_groups]  # fmt: skip
        s = self.schedule
        return {
            "sync_every": s.sync_every, "fragment_sync_delay": s.delay, "alpha": self.alpha,
            "seed": self.seed, "world_size": self.size,
            "outer_optimizer": f"{type(self.outer).__name__} {groups}",
        }  # fmt: skip

    def _make_coders(self) -> list[OuterCoder]:
        key = rank_seed(self.seed, self.rank)
        return [
            OuterCoder(alg, fb, x.numel(), x.device, key, chunk_tensor_id(f"diloco:{n}"))
            for (n, x), alg, fb in zip(self._rows(), self.codecs, self.feedback, strict=True)
        ]

    def _rows(self) -> list[tuple[str, torch.Tensor]]:
        """Each parameter's name and the rows of it this rank holds (all, unsharded)."""
        return [(n, shards.local(p)) for n, p in self.named]

    def _fragment_sync(self, k: int) -> FragmentSync:
        idx, rows = self.frags[k], [x for _, x in self._rows()]
        devices = {rows[i].device for i in idx}
        if len(devices) > 1:
            raise DiLoCoError(
                f"fragment {k} has parameters on {sorted(map(str, devices))}: a fragment's "
                "parameters must share a device; split it into fragments per device"
            )
        return FragmentSync([rows[i].numel() for i in idx],
                            [self.coders[i] for i in idx], devices.pop(), self.group)  # fmt: skip

    # ---- driving --------------------------------------------------------------------------------

    def __enter__(self) -> DiLoCo:
        if self._hook is not None:
            raise DiLoCoError("this DiLoCo is already in a `with` block")
        self._hook = self.inner.register_step_post_hook(lambda *_: self._after_inner_step())
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        hook, self._hook = self._hook, None
        if hook is not None:
            hook.remove()
        if kind is None:
            self.settle()
        else:  # leave no collective pending behind a failure (gloo aborts at exit otherwise)
            try:
                self.settle()
            except Exception:  # the failure being raised says more
                log.debug("an outer collective failed while leaving after an error")

    def step(self) -> None:
        """Count one inner step (call it after each ``inner_optimizer.step()``; a ``with``
        block does it for you); runs every outer sync due after it. Raises
        :class:`DiLoCoError` inside a ``with`` block (the step would count twice)."""
        if self._hook is not None:
            raise DiLoCoError(
                "step() inside `with diloco:` counts each inner step twice: the block already "
                "counts inner_optimizer.step(); use one or the other"
            )
        self._after_inner_step()

    def _after_inner_step(self) -> None:
        self.stats.inner_steps += 1
        t = self.stats.inner_steps
        if self.auto is not None:
            self.auto.inner_step(t)
        for k in self.schedule.starts(t):
            self._start(k, t)
        for k in self.schedule.applies(t):
            self._apply(k, t)

    def _start(self, k: int, t: int) -> None:
        began = time.perf_counter()
        if self.pending[k] is not None:
            raise DiLoCoError(f"fragment {k}: a sync is still pending at inner step {t}")
        sync = self.syncs[k]
        with torch.no_grad():
            for i, view in zip(self.frags[k], sync.views, strict=True):
                p, a = shards.local(self.named[i][1]), self.anchors[i]
                out = view.view(p.shape)
                if p.dtype == torch.float32:
                    torch.sub(a, p, out=out)
                else:  # in float32, not in the parameter's precision
                    out.copy_(a).sub_(p)
        self.pending[k] = sync.start(f"the outer sync of fragment {k} at inner step {t}")
        self.stats.sent_bytes += sync.wire_bytes()
        n = self.size
        self.stats.raw_bytes += 2 * (n - 1) * 4 * sum(sync.numels) // max(1, n)
        self.stats.encode_s += time.perf_counter() - began

    def _apply(self, k: int, t: int) -> None:
        began = time.perf_counter()
        p_k = self.pending[k]
        if p_k is None:
            raise DiLoCoError(f"fragment {k}: nothing to apply at inner step {t}")
        what = f"the outer sync of fragment {k} at inner step {t}"
        p_k.wait(what)
        waited = time.perf_counter()
        means = self.syncs[k].finish(p_k, what)
        decoded = time.perf_counter()
        self.pending[k] = None
        self.outer_step(k, means)
        self.stats.syncs += 1
        self.stats.per_fragment[k] += 1
        done = time.perf_counter()
        s = self.stats
        s.wait_s += waited - began
        s.decode_s += decoded - waited
        s.step_s += done - decoded

    def outer_step(self, k: int, means: list[torch.Tensor]) -> None:
        """Apply fragment ``k``'s mean outer gradients ``means`` (flat float32, one per
        parameter of the fragment): parameters to the anchor, ``.grad`` to the mean, one step of
        the outer optimizer, the result the new anchor, then mixed with the local weights by
        alpha. Every other parameter's ``.grad`` is None during the step and restored after."""
        params = [p for _, p in self.named]
        saved = [p.grad for p in params]
        try:
            local = []
            with torch.no_grad():
                for p in params:
                    p.grad = None
                for i, m in zip(self.frags[k], means, strict=True):
                    x = shards.local(params[i])
                    local.append(x.clone() if self.alpha else None)
                    x.copy_(self.anchors[i])
                    params[i].grad = shards.as_grad(params[i], m)
            self.outer.step()
            with torch.no_grad():
                for i, loc in zip(self.frags[k], local, strict=True):
                    x = shards.local(params[i])
                    self.anchors[i].copy_(x)
                    if loc is not None:
                        x.lerp_(loc, self.alpha)
        finally:
            for p, g in zip(params, saved, strict=True):
                p.grad = g

    def settle(self) -> None:
        """Wait for every outer collective in flight (their results are applied at their step
        as planned). Raises :class:`CommError` if one failed."""
        for k, p in enumerate(self.pending):
            if p is not None and p.work is not None:
                began = time.perf_counter()
                p.wait(f"the outer sync of fragment {k}")
                self.stats.wait_s += time.perf_counter() - began

    # ---- checkpoints ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """This rank's state (CPU copies): the outer optimizer, the anchor weights, the codec
        states with their error feedback, the counters and any outer sync in flight (waited
        for). Save it with the model's and the inner optimizer's; resuming with the same world
        size continues bit for bit."""
        self.settle()
        return checkpoint.save(self)

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`, all or nothing. Raises :class:`DiLoCoError` for another
        rank's, another configuration's or a damaged state dict."""
        checkpoint.load(self, sd)

    # ---- reading ----------------------------------------------------------------------------------

    @property
    def algorithms(self) -> dict[str, CompressionAlgorithm]:
        """Each trainable parameter's codec, by name."""
        return {n: a for (n, _), a in zip(self.named, self.codecs, strict=True)}

    def owed(self) -> dict[str, torch.Tensor]:
        """Each parameter's error-feedback memory: what this rank's outer gradients sent so far
        still owe (zero without feedback)."""
        return {n: c.owed() for (n, _), c in zip(self.named, self.coders, strict=True)}

    def __repr__(self) -> str:
        s = self.schedule
        codecs = sorted({a.name for a in self.codecs})
        return (f"DiLoCo(sync_every={s.sync_every}, fragments={s.fragments}, "
                f"fragment_sync_delay={s.delay}, algorithm={'/'.join(codecs)}, "
                f"ranks={self.size})")  # fmt: skip
