"""hipress bench convergence, small: real 2-process gloo runs of the LSTM LM task."""

from __future__ import annotations

from hipress.bench.convergence import (
    ConvergenceOptions,
    convergence_markdown,
    density_schedule,
    run_convergence,
)


def test_convergence_rows_and_dgc_momentum() -> None:
    opts = ConvergenceOptions(
        workers=2, algorithms=("topk", "dgc"), epochs=2, train_tokens=4096,
        eval_tokens=2048, batch=4, timeout=300, density_warmup_epochs=1,
    )  # fmt: skip
    res = run_convergence(opts)
    rows = {r["algorithm"]: r for r in res["rows"]}
    assert list(rows) == ["uncompressed", "topk", "dgc"]
    for r in rows.values():
        assert "error" not in r, r.get("error")
        assert 0.0 <= r["accuracy"] <= 1.0 and r["finite"]
        assert r["steps"] == rows["uncompressed"]["steps"] > 20
    assert rows["uncompressed"]["delta_points"] == 0.0
    for r in rows.values():  # evaluated after every epoch; the last is the final accuracy
        assert len(r["epoch_accuracy"]) == 2 and r["epoch_accuracy"][-1] == r["accuracy"]
        assert r["best_accuracy"] == max(r["epoch_accuracy"])
        assert r["epoch_accuracy"][r["best_epoch"] - 1] == r["best_accuracy"]
    best = rows["uncompressed"]["best_accuracy"]
    assert rows["dgc"]["best_delta_points"] == 100 * (rows["dgc"]["best_accuracy"] - best)
    assert rows["topk"]["error_feedback"] and rows["dgc"]["error_feedback"]
    # DGC's momentum correction replaces the optimizer's momentum; the others keep it
    assert rows["dgc"]["optimizer_momentum"] == 0.0
    assert rows["topk"]["optimizer_momentum"] == opts.momentum
    table = convergence_markdown(res)
    assert "| dgc | yes |" in table and "| uncompressed | - |" in table
    assert "density warm-up: 1 epoch(s)" in table


def test_density_schedule_is_dgcs_warm_up() -> None:
    """25%, 6.25%, 1.5625%, ... of the elements, 4x fewer each epoch, then the algorithm's own
    fraction; for drop_ratio the complement; nothing for algorithms that do not sparsify."""
    assert density_schedule("dgc", 4, 10) == [
        (0, {"s_percent": 0.25}),
        (10, {"s_percent": 0.0625}),
        (20, {"s_percent": 0.015625}),
        (30, {"s_percent": 0.00390625}),
        (40, {"s_percent": 0.001}),
    ]
    # never denser than needed: topk's own 1% is reached in the fourth epoch
    assert density_schedule("topk", 5, 7)[3:] == [(21, {"ratio": 0.01})]
    assert density_schedule("graddrop", 1, 5) == [
        (0, {"drop_ratio": 0.75}),
        (5, {"drop_ratio": 0.99}),
    ]
    assert density_schedule("onebit", 4, 10) == [] and density_schedule("dgc", 0, 10) == []
