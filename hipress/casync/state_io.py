"""Checkpoints and pickling of a :class:`~hipress.casync.state.CaSyncState`
(:class:`Checkpoints`, a mixin): ``state_dict``, ``gathered_state_dict``, ``load_state_dict``
(the functions of :mod:`hipress.casync.persist` over the state's runtime) and what a pickle
keeps (the runtime is rebuilt from the plans and states saved beside it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hipress.casync import persist
from hipress.casync.config import params_at
from hipress.casync.rounds_plan import resolve_any
from hipress.codec.algorithm import build_kernels
from hipress.codec.errors import CaSyncError
from hipress.core.plan import PlanError

__all__ = ["Checkpoints"]

# left out of a pickle (the runtime is rebuilt from the plans and states saved beside it)
_UNPICKLED = ("process_group", "_rt", "_param_names", "_lock", "_unused_model", "comm_error")


class Checkpoints:
    """The checkpoint and pickling half of :class:`~hipress.casync.state.CaSyncState`."""

    # (set by CaSyncState)
    rank: int | None
    world_size: int | None
    process_group: Any
    comm_error: Any
    _rt: Any
    _check: Any
    _rows: Any
    _spec: Any

    def state_dict(self) -> dict[str, Any]:
        """This rank's algorithm states (error feedback, momentum, RNG counters), CPU copies,
        with the step count and the plan they were trained with.

        States differ per rank: save one per rank and load each into the same rank, or save
        :meth:`gathered_state_dict` from rank 0.
        """
        rt = self._runtime()
        assert self.rank is not None and self.world_size is not None
        return persist.save(rt, self.rank, self.world_size)

    def gathered_state_dict(self) -> dict[str, Any]:
        """Every rank's :meth:`state_dict` in one, returned on every rank: ``format``
        (``"hipress.casync.gathered/1"``), ``world_size`` and ``ranks`` (the state dicts in
        rank order), for checkpoints that rank 0 alone writes; :meth:`load_state_dict` takes
        it on every rank. A collective over the state's group: every rank must call it (on
        NCCL, with its CUDA device set). After a :attr:`comm_error`, or if the gather fails,
        it holds this rank's state only (``missing`` lists the other ranks, logged as a
        warning); a rank missing from a checkpoint resumes with its states as they are."""
        rt = self._runtime()
        assert self.rank is not None and self.world_size is not None
        return persist.gather(rt, self.rank, self.world_size, self.process_group, self.comm_error)

    plan_of = staticmethod(persist.plan_of)

    def load_state_dict(self, sd: Mapping[str, Any], *, carry_over: bool = False) -> None:
        """Restore :meth:`state_dict` or :meth:`gathered_state_dict` (each rank takes its
        own entry; one missing from it keeps its states) in place, all or nothing.

        A state whose ``plan="auto"`` is not made yet takes the checkpoint's plan (no
        profiling). A checkpoint of another plan is refused, unless ``carry_over``: then the
        states of every parameter whose plan entry (strategy, partitions) is the same in both
        plans are restored, and the others keep theirs (zero in a new state).

        The plan then runs as saved (no row count or plan check). Raises :class:`CaSyncError`
        (naming rank and entry) if it was saved by another rank or world size, for another
        algorithm, plan or options (the message says how to resume), or is damaged."""
        self._attach()
        assert self.rank is not None and self.world_size is not None
        sd, step, stand_in = persist.own(sd, self.rank, self.world_size)
        planned = self._rt is not None
        if not planned and (saved := persist.plan_to_adopt(sd, self.rank)) is not None:
            try:
                self._adopt(saved)
            except PlanError as exc:
                raise CaSyncError(f"rank {self.rank}: the state dict's plan: {exc}") from None
        persist.load(
            self._runtime(), sd, step, rank=self.rank, world_size=self.world_size,
            carry_over=carry_over, check_plan=planned or self._rt is None, stand_in=stand_in,
        )  # fmt: skip
        self._check.at_step = self._rows.at_step = None  # (the saved plan runs as it is)
        self._after_step(step)

    def __getstate__(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k not in _UNPICKLED}
        rt = self._rt
        if rt is not None:
            d["_saved"] = (rt.plan, rt.base_plan, rt.config, rt.worker_states, rt.server_states)
        if self._spec is not None:
            d["algorithm"] = None  # reloaded from the spec: compiled kernels do not pickle
        return d

    def __setstate__(self, d: dict[str, Any]) -> None:
        saved = d.pop("_saved", None)
        self.__dict__.update(d)
        self.process_group = None
        self._rt = None
        if self._spec is not None:
            name, params, backend = self._spec
            if self.params_schedule:  # the step count does not pickle: start from step 0
                params = params_at(self._base_params, self.params_schedule, 0)
                self._spec = (name, params, backend)
            self.algorithm = resolve_any(name, params, backend)
            build_kernels(self.algorithm, self._devices.values())
        self._init_local()
        if saved is not None:
            plan, base_plan, config, worker, server = saved
            self._make_runtime(plan, base_plan, config, (worker, server))
