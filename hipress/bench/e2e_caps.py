"""The DDP bucket cap of ``hipress bench e2e``'s hipress rows (``--bucket-cap-mb``).

Each hipress row can run with DDP's default buckets, a given ``bucket_cap_mb``, or ``auto``:
the cap SeCoPa recommends for that row (:func:`hipress.secopa.model.bucketcap.recommend_cap`),
resolved in each cell once the compute-only run has measured when each gradient is ready. The
recommendation plans the row as the worker will run it (the algorithm's SeCoPa plan with
embeddings and 1-D tensors kept plain, or nothing compressed for the lossless row), the model's
embeddings as exact rows at the touched-row count of the ranks' first batches, priced with a
profile of this machine's codec costs (measured here, ``BUDGET_S``) on the cell's link (an
alpha-beta link at its rate, no per-call calibration), and judged by the exposed time of the
step over the buckets DDP rebuilds in ready order at each candidate cap.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from typing import Any

from hipress.bench.e2e_configs import Config
from hipress.bench.workloads import WORKLOADS

__all__ = ["BUDGET_S", "LATENCY_S", "parse_caps", "recommend_for", "resolve"]

log = logging.getLogger(__name__)

BUDGET_S = 0.6  # codec timing per algorithm and cell
LATENCY_S = 25e-6  # the link profile's latency (hipress plan --bandwidth's default)


def parse_caps(text: str) -> tuple[float | str | None, ...]:
    """``--bucket-cap-mb``'s comma list: ``default`` (None), ``auto`` or MB > 0, each once.
    Raises ValueError naming the item that is none of them."""
    out: list[float | str | None] = []
    for item in (w.strip() for w in text.split(",")):
        if item in ("default", "auto"):
            cap: float | str | None = None if item == "default" else "auto"
        else:
            try:
                cap = float(item)
            except ValueError:
                raise ValueError(item) from None
            if not (math.isfinite(cap) and 0 < cap <= 1e6):
                raise ValueError(item)
        if cap not in out:
            out.append(cap)
    return tuple(out)


def _rows(model_name: str, data: Any, world_size: int) -> dict[str, Any]:
    """Each 2-D gradient's ``(rows, touched)`` over rank 0..N-1's first batches: the most
    touched rows of any rank."""
    from hipress.casync.rowprobe import touched_rows

    w = WORKLOADS[model_name]
    model = w.build(data)
    most: dict[str, tuple[int, int]] = {}
    for rank in range(world_size):
        model.zero_grad(set_to_none=True)
        w.loss(model, *w.batch(data, rank, 0)).backward()
        for name, (rows, touched) in touched_rows(model.named_parameters()).items():
            most[name] = (rows, max(touched, most.get(name, (rows, 0))[1]))
    return most


def recommend_for(
    model_name: str,
    data: Any,
    cfg: Config,
    leads: Mapping[str, float],
    world_size: int,
    rate_mbit: float,
) -> tuple[float | None, dict[str, Any]]:
    """The cap SeCoPa recommends for ``cfg`` (None: DDP's default) and its record (module
    docstring); ``leads``: the compute-only run's ``grad_ready_lead_ms``."""
    import torch

    from hipress.casync.buckets import first_is_cap
    from hipress.codec.planning import DEFAULT_ALGORITHM, keep_plain
    from hipress.core.rule import Selection, embedding_names
    from hipress.secopa.measure.profiler import build_profile, measure_compute
    from hipress.secopa.measure.timed_codec import load_timed_codec
    from hipress.secopa.model.bucketcap import recommend_cap
    from hipress.secopa.model.planner import PlannerConfig
    from hipress.secopa.model.profile import Readiness, link_network
    from hipress.secopa.model.rowcost import RowDensity

    model = WORKLOADS[model_name].build(data)
    named = [(n, p.numel()) for n, p in model.named_parameters() if p.requires_grad]
    params = [(n, tuple(p.shape)) for n, p in model.named_parameters() if p.requires_grad]
    select = Selection((), (), "all", embedding_names(model))
    plain = select.reasons(params)
    emb = {n for n, why in plain.items() if why == "embedding"}
    rows = {n: RowDensity(r, t, exact=True)
            for n, (r, t) in _rows(model_name, data, world_size).items() if n in emb}  # fmt: skip
    codec = load_timed_codec(cfg.algorithm or DEFAULT_ALGORITHM, {}, "auto")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each worker runs
    try:
        compute = measure_compute(codec, budget_s=BUDGET_S, max_size=max(k for _, k in named))
    finally:
        torch.set_num_threads(threads)
    link = link_network(rate_mbit * 1e6 / 8, LATENCY_S)
    profile = build_profile(codec, compute, link, overlap=1.0).with_readiness(
        Readiness(dict(leads)))  # fmt: skip
    config = PlannerConfig() if cfg.algorithm is not None else PlannerConfig(strategies=())
    advice = recommend_cap(named, profile, world_size, config, rows, plain=plain,
                           finish=lambda p: keep_plain(p, plain), first_is_cap=first_is_cap())  # fmt: skip
    cap = None if advice.caps.default else advice.caps.cap_mb
    record = {**advice.to_dict(), "rows": {n: d.touched for n, d in rows.items()},
              "profile": f"{codec.name} measured here ({BUDGET_S:g} s), link {rate_mbit:g} "
                         f"Mbit/s, {LATENCY_S * 1e6:g} us"}  # fmt: skip
    log.info("e2e: %s: %s", cfg.name, advice.reason)
    return cap, record


def resolve(
    cfg: Config, model_name: str, data: Any, compute: Mapping[str, Any], world_size: int,
    rate_mbit: float | None, cache: dict[str, Config],
) -> Config:  # fmt: skip
    """``cfg`` with ``bucket_cap_mb="auto"`` replaced by the recommended cap (cached per
    configuration in ``cache``, for the cell); other configurations as they are. Without a
    link rate or ready times (loopback, or the compute-only run failed) ``auto`` keeps DDP's
    default and says so."""
    if cfg.bucket_cap_mb != "auto":
        return cfg
    if cfg.name not in cache:
        leads = compute.get("grad_ready_lead_ms")
        if rate_mbit is None or not leads:
            note = {"reason": "no recommendation: needs a shaped link and the ready times"}
            cache[cfg.name] = dataclasses.replace(cfg, bucket_cap_mb=None, cap_advice=note)
        else:
            cap, record = recommend_for(model_name, data, cfg, leads, world_size, rate_mbit)
            cache[cfg.name] = dataclasses.replace(cfg, bucket_cap_mb=cap, cap_advice=record)
    return cache[cfg.name]
