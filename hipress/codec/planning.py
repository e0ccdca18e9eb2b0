"""Which plan a compressed sync runs (the DDP hook's, Horovod's): a given
:class:`~hipress.core.plan.Plan`, one loaded from a file, SeCoPa's automatic plan, or the default
rule (:class:`~hipress.core.rule.DefaultRule`).

Every entry point takes the same words for ``plan=``: ``"default"`` (or None) for the default
rule, ``"auto"`` for SeCoPa's plan, a path to a plan file or a :class:`Plan` (:data:`PLAN_WORDS`).
A plan file that is really named ``default`` or ``auto`` is read when given as a
:class:`~pathlib.Path` or with a directory (``"./default"``).

PS and the ring compress an aggregate again (the server's shard, each hop's partial sum). An
algorithm that does not survive that (:func:`~hipress.codec.algorithm.recompressible`: an
unbiased random sparsifier such as randomk with ``memory=False`` multiplies its variance by n/k)
is planned with the all-gather by the default rule and by ``plan="auto"``; an explicit plan that
asks otherwise is run, with a warning that says why and what to change.

A :class:`~hipress.core.rule.Selection` (``include=``, ``exclude=``, ``shapes=``) is applied to
every plan: the default rule's and SeCoPa's keep what it rejects plain, embeddings and 1-D
tensors included (:func:`keep_plain`, the reasons recorded in ``plan.meta["kept_plain"]``); a
plan given explicitly keeps only what ``exclude``/``shapes`` reject, and compressing an
embedding with it logs a warning.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from hipress.codec.algorithm import recompressible
from hipress.codec.logs import RANK_FILTER
from hipress.codec.rowplan import embedding_rows
from hipress.core.compression import CompressionAlgorithm, Uncompressed, compresses
from hipress.core.plan import Plan, PlanError, Strategy, TensorPlan
from hipress.core.rule import DefaultRule, Selection
from hipress.secopa.measure.calibrate import StepProbe
from hipress.secopa.measure.runtime import auto_plan, load_plan_for_model
from hipress.secopa.measure.runtime import check_plan as check_plan_fits_model
from hipress.secopa.model.planner import PlannerConfig
from hipress.secopa.model.readiness import Readiness
from hipress.secopa.model.rowcost import RowDensity

__all__ = [
    "DEFAULT_ALGORITHM", "PLAN_WORDS", "check_plan_arg", "keep_plain", "resolve_plan",
    "rule_plan", "warn_lossy_embeddings",
]  # fmt: skip

log = logging.getLogger(__name__)
log.addFilter(RANK_FILTER)
_TWICE = (Strategy.PS, Strategy.RING)
# the plan arguments that are words, not paths: the default rule and SeCoPa's plan
PLAN_WORDS = ("default", "auto")
# The algorithm every entry point runs (and `hipress plan` plans for) when none is named: the DDP
# hook, Horovod, FSDP, the Lightning and Accelerate helpers. qsgd (4 bits per element, one scale
# per bucket of 512, stochastic rounding: unbiased) keeps each element's own size, which the Adam
# family divides by; 1-bit and sparsifying codecs (onebit, topk) send fewer bytes but take that
# size away and cost accuracy with AdamW, error feedback or not (docs: choose an algorithm).
DEFAULT_ALGORITHM = "qsgd"


def _default_plan(
    algorithm: CompressionAlgorithm,
    named_numels: Sequence[tuple[str, int]],
    world_size: int,
    rule: DefaultRule,
) -> Plan:
    if not compresses(algorithm):
        entries = tuple(
            TensorPlan(n, k, compress=False, strategy=Strategy.ALLREDUCE) for n, k in named_numels
        )
        return Plan("none", {}, world_size, entries)
    entries = tuple(rule.entry(n, k, world_size) for n, k in named_numels)
    if not recompressible(algorithm):
        entries = tuple(
            dataclasses.replace(e, strategy=Strategy.ALLGATHER) if e.strategy in _TWICE else e
            for e in entries
        )
    return Plan(algorithm.name, dict(algorithm.params), world_size, entries)


_STEP_TOTALS = ("planned", "exposed")  # predictions of the whole plan's step


def keep_plain(plan: Plan, reasons: Mapping[str, str]) -> Plan:
    """``plan`` with the entries named in ``reasons`` (``{name: why}``) uncompressed (other
    fields, e.g. a lossless synchronisation, kept), their predictions set to the uncompressed
    time where known, and ``meta["kept_plain"]`` recording every reason (the plan's own and
    these). Where an entry changes, the plan's predicted step totals (``planned``,
    ``exposed``) no longer describe it and are dropped: a planner prices a plan with these
    tensors plain when it is given them (:meth:`~hipress.secopa.model.planner.Planner.plan`'s
    ``plain``). Returns ``plan`` itself when nothing changes."""
    changed, entries = False, []
    for e in plan.entries:
        if e.compress and e.name in reasons:
            ms = e.uncompressed_ms or e.predicted_ms
            e = dataclasses.replace(
                e, compress=False, strategy=Strategy.ALLREDUCE, partitions=1, predicted_ms=ms
            )
            changed = True
        entries.append(e)
    kept = {n: why for n, why in reasons.items() if n in {e.name for e in plan.entries}}
    if not changed and not kept:
        return plan
    totals = {k: v for k, v in plan.totals.items() if not (changed and k in _STEP_TOTALS)}
    meta = {**plan.meta, "kept_plain": {**dict(plan.meta.get("kept_plain", {})), **kept}}
    return dataclasses.replace(plan, entries=tuple(entries), totals=totals, meta=meta)


def rule_plan(
    algorithm: CompressionAlgorithm,
    named_numels: Sequence[tuple[str, int]],
    world_size: int,
    rule: DefaultRule | None = None,
    selection: Selection | None = None,
    shapes: Sequence[tuple[str, tuple[int, ...] | None]] = (),
) -> Plan:
    """The plan :func:`resolve_plan` makes for ``plan=None`` (the default ``rule`` with the
    tensors ``selection`` keeps plain kept plain), without its checks or warnings; before
    ``plan="auto"`` has planned, an estimate of what a state will compress."""
    known = dict(shapes)
    pairs = [(n, known.get(n)) for n, _ in named_numels]
    plan = _default_plan(algorithm, named_numels, world_size, rule or DefaultRule())
    if not compresses(algorithm):
        return plan
    return keep_plain(plan, (selection or Selection()).reasons(pairs, implicit=True))


def warn_lossy_embeddings(
    plan: Plan, algorithm: CompressionAlgorithm, embeddings: Sequence[str]
) -> list[str]:
    """Log one warning if ``plan`` puts the lossy ``algorithm`` on any of ``embeddings``;
    return the names it does."""
    names = set(embeddings)
    hit = [e.name for e in plan.entries if e.compress and e.name in names]
    if hit and compresses(algorithm):
        log.warning(
            "%s is lossy and the plan puts it on the embedding weight%s %s: a quantised or "
            "sparsified token embedding costs accuracy; keep it plain "
            "(leave it out of include=, or exclude=[...] it)",
            algorithm.name, "s" if len(hit) > 1 else "", ", ".join(hit[:4]) + (
                f" and {len(hit) - 4} more" if len(hit) > 4 else ""),
        )  # fmt: skip
    return hit


def _auto_plan(
    algorithm: CompressionAlgorithm,
    named_numels: Sequence[tuple[str, int]],
    world_size: int,
    group: Any,
    device: Any = None,
    probe: StepProbe | None = None,
    rows: Mapping[str, RowDensity] | None = None,
    readiness: Readiness | None = None,
    plain: Collection[str] = (),
) -> Plan:
    # ---- SeCoPa hook-up: the single place where plan="auto" asks the planner. ----
    # auto_plan profiles this machine and network (every rank takes part, a few seconds),
    # calibrates with ``probe`` (CaSync's real steps), plans on rank 0 and broadcasts, so
    # every rank returns the same plan. ``rows``: the embeddings it prices as rows (their
    # break-even count, by which CaSync decides once it has counted their rows). ``plain``:
    # the tensors the selection keeps plain, planned as plain.
    if not compresses(algorithm):
        raise PlanError("plan='auto' needs a compression algorithm")
    config = None if recompressible(algorithm) else PlannerConfig(strategies=(Strategy.ALLGATHER,))
    return auto_plan(
        algorithm, named_numels, world_size, group=group, device=device, config=config,
        probe=probe, rows=rows, readiness=readiness, plain=plain,
    )  # fmt: skip


def check_plan(
    plan: Plan,
    algorithm: CompressionAlgorithm,
    named_numels: Sequence[tuple[str, int]],
    world_size: int,
) -> None:
    """Raise :class:`PlanError` unless ``plan`` fits this model, algorithm and world size."""
    check_plan_fits_model(plan, named_numels, world_size)
    compressed = [e for e in plan.entries if e.compress]
    if not compresses(algorithm):
        if compressed:
            raise PlanError(f"plan compresses {compressed[0].name!r} but no algorithm was given")
        return
    if compressed and plan.algorithm != algorithm.name:
        raise PlanError(
            f"plan is for algorithm {plan.algorithm!r}, the hook runs {algorithm.name!r}"
        )
    have: Mapping[str, Any] = algorithm.params
    wrong = {k: v for k, v in plan.params.items() if k in have and have[k] != v}
    if compressed and wrong:
        raise PlanError(
            f"plan parameters {wrong} differ from the algorithm's {dict(have)}; "
            "make the plan for the same parameters"
        )
    twice = [e.name for e in compressed if e.strategy in _TWICE]
    if twice and not recompressible(algorithm):
        log.warning(
            "%s loses accuracy when compressed twice, which the plan's PS/ring tensors (%s%s) "
            "do at the server or at each hop (an unbiased random sparsifier: n/k times the "
            "variance); plan them "
            "with the all-gather (the default rule and plan='auto' do, or `hipress plan "
            "--strategies allgather`)",
            algorithm.name, twice[0], f" and {len(twice) - 1} more" if len(twice) > 1 else "",
        )  # fmt: skip
    for e in compressed:
        if e.strategy is Strategy.RING and world_size < 2:
            raise PlanError(f"{e.name}: the ring strategy needs at least 2 workers")
        per_part = e.numel // e.partitions
        need = world_size if e.strategy in (Strategy.PS, Strategy.RING) else 1
        if per_part < need:
            raise PlanError(
                f"{e.name}: {e.numel} elements cannot form {e.partitions} partitions of at least "
                f"{need} elements each ({e.strategy.value}); lower its partitions"
            )


def check_plan_arg(
    plan: Plan | str | Path | None, algorithm: CompressionAlgorithm | None
) -> Plan | str | None:
    """``plan`` as far as it can be checked before the process group exists: ``"default"``
    becomes None (the default rule); a plan file is read (a missing one says so and names
    ``"auto"``); ``"auto"`` needs a compression algorithm. Returns the :class:`Plan` read, None,
    or ``"auto"``. Raises :class:`PlanError`."""
    if isinstance(plan, str) and plan == "default":
        return None
    if isinstance(plan, str) and plan == "auto":
        if algorithm is None or not compresses(algorithm):
            raise PlanError("plan='auto' needs a compression algorithm")
        return plan
    if isinstance(plan, str | Path):
        try:
            return Plan.load(plan)
        except OSError as exc:
            hint = (
                " (for the plan SeCoPa makes for this model, pass plan='auto')"
                if isinstance(exc, FileNotFoundError)
                else ""
            )
            raise PlanError(f"cannot read plan {plan}: {exc.strerror}{hint}") from None
    return plan


def resolve_plan(
    plan: Plan | str | Path | None,
    algorithm: CompressionAlgorithm | None,
    named_numels: Sequence[tuple[str, int]],
    world_size: int,
    rule: DefaultRule | None = None,
    group: Any = None,
    device: Any = None,
    probe: StepProbe | None = None,
    selection: Selection | None = None,
    shapes: Sequence[tuple[str, tuple[int, ...] | None]] = (),
    readiness: Readiness | None = None,
) -> Plan:
    """Return the plan to run and check that it fits.

    ``algorithm`` is the codec (None or :class:`~hipress.core.compression.Uncompressed`: no
    compression). Takes a :class:`Plan`, a path to a plan JSON file, ``"auto"`` (SeCoPa
    profiles and plans it on ``device``, a collective call over ``group``: every rank must make
    it; ``probe`` runs CaSync's steps to calibrate the profile) or ``"default"``/None (the
    :class:`DefaultRule` ``rule``); ``named_numels`` are the (name, numel) pairs of every parameter
    that receives a gradient. Raises :class:`PlanError` if the plan does not cover exactly these
    parameters, was made for another world size or algorithm, or asks for partitions too small
    to split. ``selection`` (default: :class:`Selection`'s defaults) says which tensors are kept
    plain, judged with their ``shapes`` (``(name, shape)`` pairs; a name left out has an
    unknown shape). ``readiness``: the gradients' ready times ``"auto"`` plans with (the
    exposed step time).
    """
    if algorithm is None:
        algorithm = Uncompressed()
    sel = selection or Selection()
    known = dict(shapes)
    pairs = [(n, known.get(n)) for n, _ in named_numels]
    if plan is None or (isinstance(plan, str) and plan == "default"):
        resolved = _default_plan(algorithm, named_numels, world_size, rule or DefaultRule())
    elif isinstance(plan, Plan):
        resolved = plan
    elif isinstance(plan, str) and plan == "auto":
        rows = embedding_rows(sel, pairs)  # embeddings kept plain: priced as exact rows
        resolved = _auto_plan(algorithm, named_numels, world_size, group, device, probe, rows,
                              readiness, sel.reasons(pairs, implicit=True))  # fmt: skip
    elif isinstance(plan, (str, Path)):
        resolved = load_plan_for_model(plan, named_numels, world_size)
    else:
        raise PlanError(
            f"plan must be 'default', 'auto', a path to a plan file or a Plan, got "
            f"{type(plan).__name__}"
        )
    explicit = isinstance(plan, Plan | Path) or (isinstance(plan, str) and plan not in PLAN_WORDS)
    if compresses(algorithm):
        resolved = keep_plain(resolved, sel.reasons(pairs, implicit=not explicit))
    warn_lossy_embeddings(resolved, algorithm, [n for n, s in pairs if sel.is_embedding(n, s)])
    check_plan(resolved, algorithm, named_numels, world_size)
    return resolved
