"""Checkpoints and pickling of :class:`~hipress.casync.state.CaSyncState`: its state dict
(this rank's, with the plan it was trained with), the gathered form of every rank's that rank 0
alone can write, loading either form, and pickling without the process group.

The state dict formats are in :mod:`hipress.codec.checkpoint`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch.distributed as dist

from hipress.casync.config import FORMAT, params_at
from hipress.codec.algorithm import build_kernels, resolve_algorithm
from hipress.codec.checkpoint import gathered, is_gathered, load_states, own_entry, save_states
from hipress.codec.errors import CaSyncError
from hipress.codec.logs import RANK_FILTER
from hipress.core.plan import Plan, PlanError

logger = logging.getLogger(__name__)
logger.addFilter(RANK_FILTER)

__all__ = ["Checkpoints"]


class Checkpoints:
    """:class:`~hipress.casync.state.CaSyncState`'s checkpoint and pickling methods (a mixin
    over its fields and its binding methods ``_attach``, ``_ready``, ``_resolve``, ``_adopt``,
    ``_init_local``, ``_relayout``, ``_init_runtime``, ``_after_step``, ``config_digest``)."""

    rank: int | None
    world_size: int | None
    process_group: Any
    worker_states: dict[str, Any]
    server_states: dict[str, Any]
    _plan: Plan | None
    _base_plan: Plan
    _spec: tuple[str, dict[str, Any], str] | None
    _engine: Any

    # ---- checkpoints and pickling -----------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """This rank's algorithm states (error feedback, momentum, RNG counters), CPU copies,
        with the step count and the plan they were trained with.

        States differ per rank: save one per rank and load each into the same rank, or save
        :meth:`gathered_state_dict` from rank 0.
        """
        self._ready()
        engine = self._engine
        if engine.unused is not None and not engine.open:
            engine.unused.settle()
        assert self.rank is not None and self.world_size is not None
        sd = save_states(FORMAT, self.rank, self.world_size, self.config_digest(), self._parts())
        sd["step"] = engine.step
        sd["plan"] = self._base_plan.to_dict()
        return sd

    def gathered_state_dict(self) -> dict[str, Any]:
        """Every rank's :meth:`state_dict` in one, returned on every rank: ``format``
        (``"hipress.casync.gathered/1"``), ``world_size`` and ``ranks`` (the state dicts in
        rank order). For checkpoints that rank 0 alone writes; :meth:`load_state_dict` takes
        it on every rank. A collective over the state's group: every rank must call it (on
        NCCL, with its CUDA device set)."""
        mine = self.state_dict()
        assert self.world_size is not None
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, mine, group=self.process_group)
        return gathered(out, self.world_size)

    @staticmethod
    def plan_of(sd: Mapping[str, Any]) -> Plan:
        """The plan a :meth:`state_dict` or :meth:`gathered_state_dict` was trained with: pass
        it as ``plan=`` to resume under it. Raises :class:`CaSyncError` if it holds none."""
        ranks = sd.get("ranks") if is_gathered(sd) else [sd]
        one = ranks[0] if isinstance(ranks, list | tuple) and ranks else None
        raw = one.get("plan") if isinstance(one, Mapping) else None
        if raw is None:
            raise CaSyncError(
                "the state dict holds no plan (it was saved by an earlier hipress): pass the "
                "plan file it was trained with as plan="
            )
        try:
            return Plan.from_dict(raw)
        except PlanError as exc:
            raise CaSyncError(f"damaged CaSync state dict: its `plan`: {exc}") from None

    def _parts(self) -> dict[str, dict[str, Any]]:
        return {"worker": self.worker_states, "server": self.server_states}

    def load_state_dict(self, sd: Mapping[str, Any], *, carry_over: bool = False) -> None:
        """Restore :meth:`state_dict` or :meth:`gathered_state_dict` (each rank takes its
        own entry) in place, all or nothing.

        A state whose ``plan="auto"`` is not made yet takes the checkpoint's plan (no
        profiling). A checkpoint of another plan is refused, unless ``carry_over``: then the
        states of every parameter whose plan entry (strategy, partitions) is the same in both
        plans are restored, and the others keep theirs (zero in a new state).

        Raises :class:`CaSyncError` (naming the rank and the entry) if it was saved by another
        rank or world size, for another algorithm, plan or options (the message says how to
        resume), or is damaged (a missing entry, a tensor of another shape or dtype, a step
        that is not an integer >= 0)."""
        self._attach()
        assert self.rank is not None and self.world_size is not None
        if is_gathered(sd):
            sd = own_entry(sd, self.rank, self.world_size, CaSyncError)
        step = sd.get("step", 0) if isinstance(sd, Mapping) else 0
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise CaSyncError(
                f"rank {self.rank}: state dict `step` must be an integer >= 0, got {step!r}"
            )
        if self._take_plan(sd, refuse=not carry_over):
            sd = self._carried(sd)
        load_states(
            sd, fmt=FORMAT, what="CaSync", rank=self.rank, world_size=self.world_size,
            config=self.config_digest(), parts=self._parts(), error=CaSyncError,
        )  # fmt: skip
        if self._engine.unused is not None:
            self._engine.unused.forget()
        self._engine.step = step  # where warm-up and the schedule stand
        self._after_step(step)

    def _take_plan(self, sd: Any, refuse: bool) -> bool:
        """Adopt the plan of ``sd`` if this state's ``"auto"`` plan is not made yet. Return
        whether ``sd`` holds another plan than the one this state runs (``refuse``: raise
        then, saying how to resume)."""
        ours = isinstance(sd, Mapping) and sd.get("format") == FORMAT
        if not ours and self._plan is None:  # (refused before planning, which is collective)
            got = sd.get("format") if isinstance(sd, Mapping) else type(sd).__name__
            raise CaSyncError(f"rank {self.rank}: not a CaSync state dict (format {got!r})")
        has = ours and "plan" in sd
        saved = self.plan_of(sd) if has else None
        if self._plan is None and saved is not None:
            try:
                self._adopt(self._resolve(saved))
            except PlanError as exc:
                raise CaSyncError(f"rank {self.rank}: the state dict's plan: {exc}") from None
            return False
        other = saved is not None and saved.digest() != self._base_plan.digest()
        if other and refuse:
            assert saved is not None
            raise CaSyncError(
                f"rank {self.rank}: the state dict was saved with a different plan "
                f"({saved.digest()}; this state runs {self._base_plan.digest()}). To resume "
                "it, make the state with plan=CaSyncState.plan_of(checkpoint) (or "
                "plan='auto', which takes the saved plan); to keep this plan, do not load the "
                "hook's state (error feedback then starts afresh), or load it with "
                "carry_over=True (the states of parameters planned alike carry over)"
            )
        return other

    def _carried(self, sd: Mapping[str, Any]) -> dict[str, Any]:
        """``sd`` made to fit this state's plan: the states of parameters planned alike in
        both plans from ``sd``, the others this state's own (checked by ``load_states``)."""
        saved = {e.name: e for e in self.plan_of(sd).entries}
        alike = {
            e.name
            for e in self._base_plan.entries
            if (s := saved.get(e.name)) is not None
            and (s.numel, s.compress, s.strategy, s.partitions)
            == (e.numel, e.compress, e.strategy, e.partitions)
        }
        out = dict(sd)
        if isinstance(sd.get("config"), Mapping):
            out["config"] = {**sd["config"], "plan": self.config_digest()["plan"]}
        fresh = []
        for part, states in self._parts().items():
            theirs = sd.get(part)
            if not isinstance(theirs, Mapping):
                continue  # (load_states names what is missing)
            mine = {}
            for key, state in states.items():
                if key.rpartition("#")[0] in alike:
                    if key not in theirs:
                        raise CaSyncError(
                            f"rank {self.rank}: damaged CaSync state dict: no {part} state `{key}`"
                        )
                    mine[key] = theirs[key]
                else:
                    mine[key] = state.state_dict()
                    fresh.append(key)
            out[part] = mine
        logger.info(
            "casync: state dict of another plan: %d states carried over, %d kept as they were "
            "(%s)", sum(len(v) for v in self._parts().values()) - len(fresh), len(fresh),
            ", ".join(sorted({k.rpartition("#")[0] for k in fresh})) or "none",
        )  # fmt: skip
        return out

    def __getstate__(self) -> dict[str, Any]:
        runtime = ("process_group", "_ctx", "_engine", "_param_names", "_lock", "_agreed",
                   "_layout", "_unused_model")  # fmt: skip
        d = {k: v for k, v in self.__dict__.items() if k not in runtime}
        if self._spec is not None:
            d["algorithm"] = None  # reloaded from the spec: compiled kernels do not pickle
        return d

    def __setstate__(self, d: dict[str, Any]) -> None:
        self.__dict__.update(d)
        self.process_group = None
        if self._spec is not None:
            name, params, backend = self._spec
            if self.params_schedule:  # the step count does not pickle: start from step 0
                params = params_at(self._base_params, self.params_schedule, 0)
                self._spec = (name, params, backend)
            self.algorithm = resolve_algorithm(name, params, backend)
            build_kernels(self.algorithm, self._devices.values())
        self._init_local()
        if self._plan is not None:
            self._relayout()
            self._init_runtime()
