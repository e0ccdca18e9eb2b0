"""Which plan a compressed sync runs (hipress.codec.planning)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hipress.codec.planning import resolve_plan
from hipress.compll import load
from hipress.core.plan import Plan, PlanError, Strategy, TensorPlan
from hipress.core.rule import DefaultRule

NAMED = [("w1", 1 << 20), ("b1", 1024), ("w2", 20_000_000), ("tiny", 3)]


def test_default_rule_sends_small_uncompressed_and_large_by_ps() -> None:
    plan = resolve_plan(None, load("terngrad"), NAMED, 4)
    by = {e.name: e for e in plan.entries}
    assert by["b1"].strategy is Strategy.ALLREDUCE and not by["b1"].compress
    assert by["tiny"].strategy is Strategy.ALLREDUCE
    assert by["w1"].strategy is Strategy.PS and by["w1"].partitions == 1
    assert by["w2"].strategy is Strategy.PS and by["w2"].partitions == 4  # ceil(20M / 4M)
    assert plan.algorithm == "terngrad" and plan.world_size == 4


def test_rule_is_configurable_and_validated() -> None:
    rule = DefaultRule(min_compress_numel=100, partition_numel=1000, max_partitions=2)
    plan = resolve_plan(None, load("onebit"), [("a", 150), ("b", 50)], 2, rule)
    assert [(e.compress, e.partitions) for e in plan.entries] == [(True, 1), (False, 1)]
    with pytest.raises(ValueError, match="max_partitions"):
        DefaultRule(max_partitions=0)


def test_no_algorithm_means_allreduce_everywhere() -> None:
    plan = resolve_plan(None, None, NAMED, 2)
    assert all(e.strategy is Strategy.ALLREDUCE for e in plan.entries)


def test_plans_from_files_are_checked(tmp_path: Path) -> None:
    alg = load("terngrad")
    good = resolve_plan(None, alg, NAMED, 2)
    path = tmp_path / "plan.json"
    good.save(path)
    assert resolve_plan(str(path), alg, NAMED, 2) == good
    with pytest.raises(PlanError, match="workers"):
        resolve_plan(path, alg, NAMED, 4)
    with pytest.raises(PlanError, match="cannot read plan"):
        resolve_plan(tmp_path / "missing.json", alg, NAMED, 2)
    with pytest.raises(PlanError, match="missing parameters"):
        resolve_plan(good, alg, [*NAMED, ("extra", 5)], 2)
    with pytest.raises(PlanError, match="algorithm 'terngrad'"):
        resolve_plan(good, load("onebit"), NAMED, 2)
    with pytest.raises(PlanError, match="bitwidth"):
        resolve_plan(good, load("terngrad", bitwidth=4), NAMED, 2)
    with pytest.raises(PlanError, match="no algorithm"):
        resolve_plan(good, None, NAMED, 2)


def test_partitions_must_leave_a_shard_per_worker() -> None:
    plan = Plan("terngrad", {}, 4, (TensorPlan("a", 10, True, Strategy.PS, 3),))
    with pytest.raises(PlanError, match="lower its partitions"):
        resolve_plan(plan, load("terngrad"), [("a", 10)], 4)


def test_randomk_is_never_compressed_twice_by_default(caplog: pytest.LogCaptureFixture) -> None:
    """randomk without memory scales by n/k: a PS server or a ring hop compressing the
    aggregate again multiplies its variance by n/k (94x the error measured). The default rule
    gives it the all-gather; an explicit PS plan runs, with a warning that says why. (With
    memory, its default, it keeps error feedback and survives a second compression.)"""
    from hipress.codec.algorithm import recompressible
    from hipress.codec.planning import resolve_plan
    from hipress.compll import algorithms, load

    assert [a for a in algorithms() if not recompressible(load(a))] == []
    unbiased = load("randomk", memory=False)
    assert not recompressible(unbiased)
    named = [("w", 1 << 20), ("b", 100)]
    plan = resolve_plan(None, unbiased, named, 4)
    assert [e.strategy for e in plan.entries] == [Strategy.ALLGATHER, Strategy.ALLREDUCE]
    assert resolve_plan(None, load("topk"), named, 4).entries[0].strategy is Strategy.PS
    explicit = Plan("randomk", dict(unbiased.params), 4, (
        TensorPlan("w", 1 << 20, True, Strategy.PS, 1),
        TensorPlan("b", 100, False, Strategy.ALLREDUCE, 1),
    ))  # fmt: skip
    with caplog.at_level("WARNING"):
        resolve_plan(explicit, unbiased, named, 4)
    assert "randomk loses accuracy when compressed twice" in caplog.text


def test_plan_words_mean_the_same_on_every_entry_point(tmp_path: Path) -> None:
    from hipress.codec.planning import check_plan_arg
    from hipress.fsdp.errors import FsdpError
    from hipress.fsdp.planning import FsdpPlan, UnitInfo, local_decisions

    alg = load("onebit")
    by_rule = resolve_plan(None, alg, NAMED, 2)
    # DDP's hook and Horovod (both resolve with resolve_plan): "default" is the default rule
    assert check_plan_arg("default", alg) is None
    assert resolve_plan("default", alg, NAMED, 2) == by_rule
    with pytest.raises(PlanError, match="needs a compression algorithm"):
        check_plan_arg("auto", None)
    # a file really named "default" is read when the path says it is one
    (tmp_path / "default").write_text(by_rule.to_json())
    assert check_plan_arg(tmp_path / "default", alg) == by_rule
    # FSDP: "default" and None are the size rule, an FsdpPlan makes its decisions again
    import torch

    units = [UnitInfo("a", 1 << 20, 2, torch.float32), UnitInfo("b", 8, 2, torch.float32)]
    rule = DefaultRule()
    default = local_decisions("default", units, rule)
    assert default is not None and local_decisions(None, units, rule) == default
    assert [u.compress for u in default.values()] == [True, False]
    flipped = local_decisions(FsdpPlan("explicit", local_decisions({"a": False}, units, rule)),
                              units, rule)  # fmt: skip
    assert flipped is not None and not flipped["a"].compress
    with pytest.raises(FsdpError, match=r"per-parameter plan .* is for DDP and Horovod"):
        local_decisions(by_rule, units, rule)
    with pytest.raises(FsdpError, match=r"per-parameter plan .* is for DDP and Horovod"):
        local_decisions(str(tmp_path / "default"), units, rule)


def test_one_default_algorithm_on_every_entry_point(capsys: pytest.CaptureFixture[str]) -> None:
    import inspect

    import hipress.casync
    import hipress.fsdp
    import hipress.horovod
    from hipress.casync import CaSyncState
    from hipress.cli import main
    from hipress.codec.planning import DEFAULT_ALGORITHM, check_plan

    entry_points = [hipress.casync.register, CaSyncState, hipress.fsdp.register,
                    hipress.horovod.DistributedOptimizer]  # fmt: skip
    for module in ("lightning", "accelerate"):
        try:
            mod = __import__(f"hipress.integrations.{module}", fromlist=["_"])
        except ImportError:
            continue
        entry_points.append(getattr(mod, "HipressCallback", None) or mod.register)
    for fn in entry_points:
        default = inspect.signature(fn).parameters["algorithm"].default
        assert default == DEFAULT_ALGORITHM == "qsgd", fn
    # `hipress plan` without --algorithm plans for it, and the hook's default accepts that plan
    argv = ["plan", "--model", "mlp", "--workers", "2", "--bandwidth", "1gbit", "--budget", "0.1"]
    assert main([*argv, "--threads", "1", "--json"]) == 0
    plan = Plan.from_json(capsys.readouterr().out)
    assert plan.algorithm == DEFAULT_ALGORITHM
    check_plan(plan, load(DEFAULT_ALGORITHM), [(e.name, e.numel) for e in plan.entries], 2)
