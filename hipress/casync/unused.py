"""Error feedback under DDP's ``find_unused_parameters=True``.

A parameter that no rank used in a step still sits in its bucket (as zeros): CaSync encodes its
residual, the encode marks part of it as sent, and then DDP discards the result, because it
leaves the gradient of a parameter unused everywhere untouched. That part of the residual would
be lost. :class:`UnusedGuard` keeps it:

- a gradient hook on each parameter records which ones this rank used since the last
  synchronised step (as DDP's own used map does, across ``no_sync`` steps too);
- before a bucket is encoded, the states of every parameter this rank did not use are copied
  (on their device; a parameter used here cannot be unused everywhere, so nothing else is);
- once DDP has reduced its used map (at the end of the backward pass), the next forward pass of
  the DDP model or :meth:`~hipress.casync.state.CaSyncState.state_dict` restores the copies of
  the parameters no rank used (not the hook: DDP holds its lock while it runs the hook). Every
  rank decides from the same reduced map, so the states stay consistent. Reading the map costs
  one small device-to-host copy, only after a step in which this rank left a parameter unused.

A parameter used on some ranks but not others is synchronised as usual: DDP applies the result,
so what the encode sent is not lost.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from hipress.codec.logs import RANK_FILTER
from hipress.compll.ir.state import State

logger = logging.getLogger(__name__)
logger.addFilter(RANK_FILTER)


def reducer_order(ddp_model: Any) -> list[torch.nn.Parameter]:
    """The parameters in the order of DDP's reducer (its used map is indexed by it): modules in
    ``named_modules`` order, their own parameters that require a gradient and are not ignored,
    each shared parameter once."""
    ignored = getattr(ddp_model, "parameters_to_ignore", set())
    seen: set[int] = set()
    out = []
    for mname, module in ddp_model.module.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            full = f"{mname}.{pname}" if mname else pname
            if p.requires_grad and full not in ignored and id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


class UnusedGuard:
    """See the module docstring. ``named``: the model's parameters by name; ``states``: the
    chunk states (worker and server) by key, whose keys start with ``name#``."""

    def __init__(
        self,
        ddp_model: Any,
        named: Iterable[tuple[str, torch.Tensor]],
        states: Iterable[Mapping[str, State]],
    ) -> None:
        self._reducer = weakref.ref(ddp_model.reducer)
        by_id = {id(p): n for n, p in named}
        self._index = {by_id[id(p)]: i for i, p in enumerate(reducer_order(ddp_model))
                       if id(p) in by_id}  # fmt: skip
        self._keys: dict[str, list[tuple[Mapping[str, State], str]]] = {}
        for d in states:
            for key in d:
                self._keys.setdefault(key.rsplit("#", 1)[0], []).append((d, key))
        self.used: set[str] = set()
        self._saved: dict[str, list[tuple[State, int, dict[str, torch.Tensor]]]] = {}
        self._handles = [
            p.register_hook(self._marker(n)) for n, p in named if n in self._index
        ]  # fmt: skip
        self._handles.append(ddp_model.register_forward_pre_hook(self._before_forward))
        self._warned = False

    def _before_forward(self, module: Any, args: Any) -> None:
        self.settle()

    def _marker(self, name: str) -> Any:
        used = self.used

        def mark(grad: torch.Tensor) -> None:
            used.add(name)

        return mark

    def before_encode(self, names: Iterable[str]) -> None:
        """Copy the states of the parameters of a bucket this rank did not use."""
        for name in names:
            if name in self.used or name in self._saved or name not in self._keys:
                continue
            self._saved[name] = [
                (s, s.step, {k: v.clone() for k, v in s.tensors.items()})
                for d, key in self._keys[name]
                for s in (d[key],)
            ]

    def step_open(self) -> None:
        """A step's first bucket: copies still held were never settled (no forward pass of the
        DDP model since their step); they cannot be any more, so they are dropped."""
        if self._saved:
            if not self._warned:
                self._warned = True
                logger.warning(
                    "casync: a step ran without a forward pass of the DDP model; states of "
                    "parameters no rank used in the step before may have lost what they kept"
                )
            self._saved.clear()

    def step_done(self) -> None:
        """A synchronised step's last bucket was submitted: usage counts afresh."""
        self.used.clear()

    def settle(self) -> list[str]:
        """Restore the states of the parameters no rank used in the last synchronised step
        (DDP's reduced used map must be final: call between steps). Returns their names."""
        if not self._saved:
            return []
        saved, self._saved = self._saved, {}
        reducer = self._reducer()
        if reducer is None:
            return []
        counts = reducer._get_local_used_map().detach().to("cpu")
        restored = []
        for name, copies in saved.items():
            if int(counts[self._index[name]]) != 0:
                continue
            for state, step, tensors in copies:
                for k, v in tensors.items():
                    state.tensors[k].copy_(v)
                state.step = step
            restored.append(name)
        if restored:
            logger.debug("casync: states of %d parameter(s) no rank used kept", len(restored))
        return restored

    def forget(self) -> None:
        """Drop the copies (the states were replaced, e.g. by a checkpoint)."""
        self._saved.clear()

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


def supported(ddp_model: Any) -> bool:
    """Whether this torch's DDP exposes its reduced used map."""
    return hasattr(getattr(ddp_model, "reducer", None), "_get_local_used_map")
