"""SeCoPa prices row-sparse tensors (:mod:`hipress.secopa.model.rowcost`): the bytes and time of
one, the break-even count, the plans that choose rows where they win and say so, and CaSync's
row decision by that break-even."""

from __future__ import annotations

import pytest

from hipress.casync.rowprobe import plan_rows
from hipress.core.plan import Plan, PlanError, Strategy, gather_own
from hipress.secopa.model.costmodel import CostModel
from hipress.secopa.model.planner import Planner, PlannerConfig, plan_named
from hipress.secopa.model.profile import Profile, Readiness, affine_profile
from hipress.secopa.model.rowcost import RowDensity, breakeven, price_rows

VOCAB, WIDTH = 50000, 1024  # lstm-lm's spec: encoder.weight is 50000 x 1024
EMB = "encoder.weight"


def _profile(bandwidth: float = 1.25e8) -> Profile:
    """A 1-bit codec on a 1 Gbit/s link."""
    return affine_profile(
        "onebit",
        encode=(8e-6, 0.05, 0.05),
        decode=(5e-7, 0.05, 0.05),
        merge=(2e-7, 0.01, 0.01),
        bytes_per_element=1 / 32,
        header=8,
        bandwidth_bytes_per_s=bandwidth,
    )


def _named() -> list[tuple[str, int]]:
    from hipress.secopa.model.specs import resolve_model

    return resolve_model("lstm-lm").named_numels()


@pytest.mark.parametrize("n", [2, 4])
def test_row_bytes_are_touched_rows_times_row_and_index_bytes_times_world(n: int) -> None:
    cm = CostModel(_profile(), n)
    p = price_rows(cm, VOCAB * WIDTH, VOCAB, 110, compressed=False)
    assert (p.bound, p.union) == (221, n * 110)
    # indices: a ring all-gather of (bound + 1) int64; values: each rank's own rows all-gathered
    # (half the bytes of the union's allreduce when no two ranks share a row)
    assert p.bytes == pytest.approx((n - 1) * 8 * 222 + (n - 1) * 4 * 110 * WIDTH)
    # a table the ranks' rows fill: the union is allreduced, as CaSync then sends it
    small = price_rows(cm, 110 * WIDTH, 110, 110, compressed=False)
    assert (small.bound, small.union) == (110, 110) and not gather_own(n, 110, 110)
    assert small.bytes == pytest.approx((n - 1) * 8 * 111 + 2 * (n - 1) / n * 4 * 110 * WIDTH)
    dense = cm.time("allreduce", VOCAB * WIDTH)
    assert p.ms < dense / 50  # 0.9% of the rows at 4 workers: far below the dense allreduce
    c = price_rows(cm, VOCAB * WIDTH, VOCAB, 110, compressed=True)
    assert c.bytes < p.bytes / 10 and c.compute_ms > p.compute_ms  # 1 bit, but encode/decode
    # a step with no touched row still pays the scan and the index all-gather
    z = price_rows(cm, VOCAB * WIDTH, VOCAB, 0, compressed=False)
    assert z.union == 0 and 0 < z.ms < p.ms


def test_breakeven_is_the_densest_step_at_which_rows_still_win() -> None:
    cm = CostModel(_profile(), 4)
    dense = cm.time("allreduce", VOCAB * WIDTH)
    be = breakeven(cm, VOCAB * WIDTH, VOCAB, dense, compressed=False)
    assert 0 < be < VOCAB
    assert price_rows(cm, VOCAB * WIDTH, VOCAB, be, False).ms < dense
    assert price_rows(cm, VOCAB * WIDTH, VOCAB, be + 1, False).ms >= dense
    assert breakeven(cm, VOCAB * WIDTH, VOCAB, 0.0, compressed=False) == -1
    with pytest.raises(ValueError, match="rows do not divide"):
        price_rows(cm, 10, 3, 1, False)


def test_the_plan_takes_rows_where_they_win_says_why_and_totals_include_them() -> None:
    named = _named()
    plain = plan_named(named, _profile(), 4)
    assert "row_prices" not in plain.meta and not any(e.row_bound for e in plain.entries)
    sparse = plan_named(named, _profile(), 4, rows={EMB: RowDensity(VOCAB, 110, exact=True)})
    e = sparse.entries[0]
    assert (e.name, e.compress, e.strategy, e.rows, e.row_bound) == (
        EMB, False, Strategy.ALLREDUCE, VOCAB, 221)  # fmt: skip
    rec = sparse.meta["row_prices"][EMB]
    assert rec["chosen"] == "rows" and rec["ms"] < rec["dense_ms"] and rec["touched"] == 110
    assert e.predicted_ms == pytest.approx(rec["ms"])
    # the predicted total holds the rows' price in place of the embedding's (compressed) time
    saved = plain.entries[0].predicted_ms - rec["ms"]
    assert saved > 0 and sparse.totals["planned"] < plain.totals["planned"] - 0.9 * saved
    assert Planner(_profile(), 4).predict(sparse) == pytest.approx(sparse.totals["planned"])
    # every rank touches every row (a tied embedding): dense, and the record says so
    tied = plan_named(named, _profile(), 4, rows={EMB: RowDensity(VOCAB, VOCAB, exact=True)})
    assert tied.meta["row_prices"][EMB]["chosen"] == "dense" and not tied.entries[0].row_bound
    assert tied.entries == plain.entries and tied.totals == plain.totals
    # compressed rows: the entry keeps the plan's compression, with the all-gather
    comp = plan_named(named, _profile(), 4, rows={EMB: RowDensity(VOCAB, 110)})
    assert comp.entries[0].compress and comp.entries[0].strategy is Strategy.ALLGATHER
    assert comp.entries[0].row_bound == 221 and comp.entries[0].partitions == 1
    assert Plan.from_json(sparse.to_json()) == sparse


def test_rows_under_the_exposed_objective() -> None:
    named = _named()
    ready = Readiness({n: 0.0 if n == EMB else 50.0 for n, _ in named}, backward_ms=60.0)
    prof = _profile().with_readiness(ready)
    dense = plan_named(named, prof, 4, PlannerConfig(objective="exposed"))
    rows = {EMB: RowDensity(VOCAB, 110, exact=True)}
    sparse = plan_named(named, prof, 4, PlannerConfig(objective="exposed"), rows=rows)
    assert sparse.entries[0].row_bound == 221
    # the embedding is ready last: what its rows save is saved from what the step exposes
    saved = dense.entries[0].predicted_ms - sparse.entries[0].predicted_ms
    assert dense.totals["exposed"] - sparse.totals["exposed"] > 0.9 * saved > 0


def test_an_auto_plan_records_the_breakeven_and_casync_decides_by_it() -> None:
    named = _named()
    plan = plan_named(named, _profile(), 4, rows={EMB: RowDensity(VOCAB, exact=True)})
    rec = plan.meta["row_prices"][EMB]
    be = rec["breakeven"]
    assert "touched" not in rec and not plan.entries[0].row_bound and 0 < be < VOCAB
    # touched rows above the old rule's quarter (4 x bound > rows / 4) but within SeCoPa's
    # break-even: rows; past the break-even: dense
    touched = min(be, VOCAB // 10)
    assert 4 * (2 * touched + 1) > VOCAB / 4
    kept = plan_rows(plan, {EMB: (VOCAB, touched)}, 4)
    assert kept.entries[0].row_bound == 2 * touched + 1
    assert kept.meta["row_prices"][EMB] | {"touched": touched, "chosen": "rows"} == (
        kept.meta["row_prices"][EMB])  # fmt: skip
    over = plan_rows(plan, {EMB: (VOCAB, be + 1)}, 4)
    assert not over.entries[0].row_bound and over.meta["row_prices"][EMB]["chosen"] == "dense"
    # a plan nobody priced keeps the fraction rule
    bare = Plan(plan.algorithm, plan.params, 4, plan.entries)
    assert not plan_rows(bare, {EMB: (VOCAB, touched)}, 4).entries[0].row_bound


def test_row_densities_that_do_not_fit_are_refused_by_name() -> None:
    named = _named()
    with pytest.raises(PlanError, match="not a parameter"):
        plan_named(named, _profile(), 4, rows={"nope": RowDensity(10, 1)})
    with pytest.raises(PlanError, match=f"{EMB}: 3 rows"):
        plan_named(named, _profile(), 4, rows={EMB: RowDensity(3, 1)})
    with pytest.raises(PlanError, match="touched"):
        plan_named(named, _profile(), 4, rows={EMB: RowDensity(VOCAB, VOCAB + 1)})


def test_hipress_plan_with_a_declared_row_density(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from hipress.cli import main

    prof = tmp_path / "p.json"
    _profile().save(prof)
    argv = ["plan", "--model", "bert-base", "--workers", "4", "--profile", str(prof),
            "--bandwidth", "1gbit", "--out", str(tmp_path / "plan.json")]  # fmt: skip
    assert main([*argv, "--row-density", "0.005"]) == 0
    out = capsys.readouterr().out
    word = "embeddings.word_embeddings.weight"
    # 153 of 30522 rows a step (0.5%, rounded up): exact rows, said in the table and below it
    assert f"  {word}: 153 of 30522 rows a step: rows " in out and "vs dense" in out
    assert any(line.startswith(word) and "plain as rows (<= 307)" in line
               for line in out.splitlines())  # fmt: skip
    plan = Plan.load(tmp_path / "plan.json")
    e = next(x for x in plan.entries if x.name == word)
    assert (e.compress, e.rows, e.row_bound) == (False, 30522, 307)
    assert plan.meta["row_prices"][word]["chosen"] == "rows"
    assert main([*argv, "--row-density", "1"]) == 0  # every row touched: dense, and said
    assert f"  {word}: 30522 of 30522 rows a step: rows " in capsys.readouterr().out
    assert not any(x.row_bound for x in Plan.load(tmp_path / "plan.json").entries)
    assert main([*argv[:2], "resnet50", *argv[3:], "--row-density", "0.1"]) == 2
    assert "needs an embedding" in capsys.readouterr().err
