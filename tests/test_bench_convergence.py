"""hipress bench convergence, small: real 2-process gloo runs of both tasks (the LSTM LM and the
tabular classifier), over seeds, and the momentum hand-over to dgc."""

from __future__ import annotations

import pytest
import torch

from hipress.bench.convergence import (
    ConvergenceOptions,
    convergence_markdown,
    density_schedule,
    run_convergence,
    summarise,
)
from hipress.bench.convergence_train import HeavyBall
from hipress.bench.models import TabularMLP, tabular_data
from hipress.bench.tables import convergence_rows


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
        (run,) = r["runs"]  # one seed: the summary is that run
        assert run["seed"] == 0 and r["accuracy"] == run["accuracy"]
        # evaluated after every epoch; the last is the final accuracy
        assert len(run["epoch_accuracy"]) == 2 and run["epoch_accuracy"][-1] == run["accuracy"]
        assert run["best_accuracy"] == max(run["epoch_accuracy"]) == r["best_accuracy"]
        assert run["epoch_accuracy"][run["best_epoch"] - 1] == run["best_accuracy"]
    assert rows["uncompressed"]["delta_points"] == 0.0
    best = rows["uncompressed"]["best_accuracy"]
    assert rows["dgc"]["best_delta_points"] == 100 * (rows["dgc"]["best_accuracy"] - best)
    assert rows["topk"]["error_feedback"] and rows["dgc"]["error_feedback"]
    # DGC's momentum correction replaces the optimizer's on the compressed parameters (from
    # the first step: no warm-up, so nothing to hand over); the others keep it
    dgc_run, topk_run = rows["dgc"]["runs"][0], rows["topk"]["runs"][0]
    assert dgc_run["optimizer_momentum"] == 0.0 and dgc_run["momentum_handed_over"] == 0
    assert topk_run["optimizer_momentum"] == opts.momentum
    table = convergence_markdown(res)
    assert "| dgc | yes |" in table and "| uncompressed | - |" in table
    assert "density warm-up: 1 epoch(s)" in table and "Seeds: 0." in table


def test_tabular_task_over_seeds_hands_momentum_to_dgc() -> None:
    """Two seeds of the tabular task with one epoch of CaSync warm-up: each seed is its own
    run (different weights and order), the summary is their mean and range, and dgc takes
    over the optimizer's momentum buffer of every compressed element when compression
    starts."""
    opts = ConvergenceOptions(
        workers=2, algorithms=("dgc",), epochs=2, task="tabular", seeds=(0, 1),
        train_samples=1024, eval_samples=512, warmup_epochs=1, timeout=300,
    )  # fmt: skip
    res = run_convergence(opts)
    base, dgc = res["rows"]
    assert "error" not in dgc, dgc.get("error")
    assert [x["seed"] for x in base["runs"]] == [0, 1]
    assert base["runs"][0]["epoch_accuracy"] != base["runs"][1]["epoch_accuracy"]
    finals = [x["accuracy"] for x in base["runs"]]
    assert base["final"]["min"] == min(finals) and base["final"]["max"] == max(finals)
    assert base["accuracy"] == pytest.approx(sum(finals) / 2)
    assert base["steps"] == 2 * (1024 // 64)
    # both weights of more than 64k elements are compressed, every element of each encoded
    # by this rank (PS: one shard per server), so all of their momentum moves over
    assert [x["momentum_handed_over"] for x in dgc["runs"]] == [2048 * 32 + 2048 * 256] * 2
    assert all(x["optimizer_momentum"] == 0.0 for x in dgc["runs"])
    # the warm-up epoch is uncompressed, bit for bit: the same first epoch as uncompressed
    for b, d in zip(base["runs"], dgc["runs"], strict=True):
        assert d["epoch_accuracy"][0] == b["epoch_accuracy"][0]
    assert res["meta"]["task_name"] == "tabular" and res["meta"]["seeds"] == [0, 1]
    table = convergence_markdown(res)
    assert "teacher-student" in table and "Seeds: 0, 1." in table


def test_summarise_pairs_seeds() -> None:
    """Means over seeds; gaps of the means, and per-seed gaps against the same seed."""

    def run(seed: int, final: float, best: float) -> dict[str, object]:
        return {"seed": seed, "accuracy": final, "best_accuracy": best, "best_epoch": 2,
                "valid_loss": 1.0, "seconds": 1.0, "steps": 10, "finite": True}  # fmt: skip

    rows = [
        {"algorithm": "uncompressed", "error_feedback": None,
         "runs": [run(0, 0.50, 0.55), run(1, 0.60, 0.65)]},
        {"algorithm": "x", "error_feedback": True,
         "runs": [run(0, 0.49, 0.56), run(1, 0.57, 0.62)]},
        {"algorithm": "y", "error_feedback": True, "runs": [], "error": "boom"},
    ]  # fmt: skip
    summarise(rows)
    x = rows[1]
    assert x["accuracy"] == pytest.approx(0.53) and x["best_accuracy"] == pytest.approx(0.59)
    assert x["delta_points"] == pytest.approx(-2.0)
    assert x["best_delta_points"] == pytest.approx(-1.0)
    assert x["delta_range"] == pytest.approx([-3.0, -1.0])
    assert x["best_delta_range"] == pytest.approx([-3.0, 1.0])
    assert x["final"]["min"] == 0.49 and x["best"]["max"] == 0.62
    assert "accuracy" not in rows[2]
    lines = convergence_rows({"rows": rows})
    assert "| x | yes | 53.00 (49.00-57.00) | -2.00 (-3.00..-1.00) |" in lines[3]
    assert "failed: boom" in lines[4]


def test_heavy_ball_is_sgds_momentum() -> None:
    """SGD without momentum after :class:`HeavyBall` takes SGD-with-momentum's steps."""
    data = tabular_data(256, 64)
    torch.manual_seed(0)
    a = TabularMLP(hidden=64)
    b = TabularMLP(hidden=64)
    b.load_state_dict(a.state_dict())
    opt_a = torch.optim.SGD(a.parameters(), lr=0.1, momentum=0.9)
    opt_b = torch.optim.SGD(b.parameters(), lr=0.1, momentum=0.0)
    hb = HeavyBall(list(b.parameters()), 0.9)
    for i in range(5):
        x, y = data.train_x[i * 32 : i * 32 + 32], data.train_y[i * 32 : i * 32 + 32]
        for model, opt in ((a, opt_a), (b, opt_b)):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            if model is b:
                hb.apply()
            opt.step()
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pa, pb)
    first = next(b.parameters())
    assert hb.pop(first) is not None and hb.pop(first) is None


def test_tabular_data_is_deterministic_and_not_trivial() -> None:
    d1, d2 = tabular_data(512, 256), tabular_data.__wrapped__(512, 256)
    assert torch.equal(d1.train_x, d2.train_x) and torch.equal(d1.valid_y, d2.valid_y)
    assert 0.6 < d1.bayes < 0.95  # noisy labels: nothing reaches 100%
    assert len(set(d1.train_y.tolist())) == 10


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
    # after CaSync's uncompressed warm-up: counted from the first compressed step
    assert density_schedule("graddrop", 1, 5, start=3) == [
        (3, {"drop_ratio": 0.75}),
        (8, {"drop_ratio": 0.99}),
    ]
    assert density_schedule("onebit", 4, 10) == [] and density_schedule("dgc", 0, 10) == []


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="unknown task"):
        ConvergenceOptions(task="imagenet")
    with pytest.raises(ValueError, match="seeds"):
        ConvergenceOptions(seeds=(0, 0))
