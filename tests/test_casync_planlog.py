"""The line a state logs when it adopts a plan (hipress.casync.planlog): the run's own plan at
INFO with the reason it compresses what it does; a calibration probe's candidate at DEBUG,
named as a probe."""

from __future__ import annotations

import logging

import pytest

from hipress.casync import DefaultRule
from hipress.casync.planlog import log_adopted, plan_reason
from hipress.core.plan import Plan, Strategy, TensorPlan

LOG = logging.getLogger("hipress.test.planlog")


def _plan(compress: tuple[bool, ...], **fields: object) -> Plan:
    entries = tuple(
        TensorPlan(f"t{i}", 1 << 20, c, Strategy.ALLGATHER if c else Strategy.ALLREDUCE)
        for i, c in enumerate(compress)
    )
    return Plan("onebit", {}, 2, entries, **fields)  # type: ignore[arg-type]


def test_an_auto_plan_that_compresses_nothing_says_why() -> None:
    plan = _plan((False, False), totals={"planned": 4.0, "all_uncompressed": 4.0})
    why = plan_reason(plan, "auto", None)
    assert "SeCoPa's plan (plan='auto')" in why and "4.00 ms against 4.00 ms" in why
    assert "predicted slower than the plain allreduce for every tensor" in why


def test_the_default_rule_names_its_threshold_and_what_it_kept_plain() -> None:
    plan = _plan((True, False), meta={"kept_plain": {"t1": "an embedding"}})
    why = plan_reason(plan, None, DefaultRule(min_compress_numel=4096))
    assert "at least 4096 elements are compressed, 1 smaller or excluded ones kept plain" in why
    assert "kept plain (1): an embedding" in why
    assert plan_reason(plan, plan, None).startswith("the plan given")


def test_the_runs_plan_is_info_and_a_probe_is_debug(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger=LOG.name):
        log_adopted(LOG, _plan((True, True)), _plan((True, True)), None, 2, probe=True)
        log_adopted(LOG, _plan((False, False)), "auto", None, 2, probe=False)
    (probe, run) = caplog.records
    assert probe.levelno == logging.DEBUG
    assert "calibration probe (synthetic gradients, not this run's plan): 2 of 2" in probe.message
    assert run.levelno == logging.INFO
    assert "0 of 2 tensors compressed, world size 2: SeCoPa's plan" in run.message


def _auto_logs(rank: int, world_size: int) -> list[tuple[int, str]]:
    """plan='auto' on a 2-layer model, 2 gloo ranks: the casync.state log records."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from hipress.casync import register

    records: list[tuple[int, str]] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = lambda r: records.append((r.levelno, r.getMessage()))  # type: ignore[method-assign]
    log = logging.getLogger("hipress.casync.state")
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Linear(256, 4))
    ddp = DistributedDataParallel(model)
    state = register(ddp, "onebit", plan="auto")
    ddp(torch.randn(8, 64)).sum().backward()
    assert state.stats.last is not None
    return [r for r in records if "tensors compressed" in r[1]]


def test_auto_logs_its_probes_as_probes_and_its_plan_with_a_reason() -> None:
    from dist_utils import run_workers

    for records in run_workers(_auto_logs, 2, timeout=120):
        probes = [m for lvl, m in records if lvl == logging.DEBUG]
        runs = [m for lvl, m in records if lvl == logging.INFO]
        assert probes and all("calibration probe" in m for m in probes), records
        assert len(runs) == 1 and "SeCoPa's plan (plan='auto')" in runs[0], records
