"""hipress bench convergence, small: real 2-process gloo runs of the LSTM LM task."""

from __future__ import annotations

from hipress.bench.convergence import ConvergenceOptions, convergence_markdown, run_convergence


def test_convergence_rows_and_dgc_momentum() -> None:
    opts = ConvergenceOptions(
        workers=2, algorithms=("topk", "dgc"), epochs=1, train_tokens=8192,
        eval_tokens=2048, batch=4, timeout=300,
    )  # fmt: skip
    res = run_convergence(opts)
    rows = {r["algorithm"]: r for r in res["rows"]}
    assert list(rows) == ["uncompressed", "topk", "dgc"]
    for r in rows.values():
        assert "error" not in r, r.get("error")
        assert 0.0 <= r["accuracy"] <= 1.0 and r["finite"]
        assert r["steps"] == rows["uncompressed"]["steps"] > 20
    assert rows["uncompressed"]["delta_points"] == 0.0
    assert rows["topk"]["error_feedback"] and rows["dgc"]["error_feedback"]
    # DGC's momentum correction replaces the optimizer's momentum; the others keep it
    assert rows["dgc"]["optimizer_momentum"] == 0.0
    assert rows["topk"]["optimizer_momentum"] == opts.momentum
    table = convergence_markdown(res)
    assert "| dgc | yes |" in table and "| uncompressed | - |" in table
