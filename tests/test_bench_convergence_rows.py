"""hipress bench convergence --rows: the lossless row-sparse mode trains exactly as DDP does
(a real 2-process gloo run of the LSTM LM, whose embedding travels as its touched rows), and
the option is checked before any training."""

from __future__ import annotations

import pytest

from hipress.bench.convergence import (
    ConvergenceOptions,
    check_convergence,
    convergence_markdown,
    run_convergence,
)
from hipress.cli import main


def test_lossless_rows_train_exactly_as_ddp() -> None:
    opts = ConvergenceOptions(
        workers=2, algorithms=(), epochs=1, train_tokens=2048, eval_tokens=512, batch=4,
        timeout=300, row_sparse=("none",),
    )  # fmt: skip
    res = run_convergence(opts)
    base, rows = res["rows"]
    assert [base["algorithm"], rows["algorithm"]] == ["uncompressed", "none-rows"]
    assert "error" not in rows, rows.get("error")
    (run,) = rows["runs"]
    # the embedding (8192 rows) travels as its touched rows, the bound measured by the probe
    (rows_n, bound) = run["row_sparse"]["embed.weight"]
    assert rows_n == 8192 and 0 < bound < rows_n // 8
    # on two ranks a + b is one sum in either order: the same losses, bit for bit
    assert run["loss_curve"] == base["runs"][0]["loss_curve"] and len(run["loss_curve"]) > 5
    assert run["epoch_valid_loss"] == base["runs"][0]["epoch_valid_loss"]
    assert rows["loss_curve_max_abs_diff"] == 0.0 == rows["valid_loss_max_abs_diff"]
    assert rows["loss_curve_same_steps"] == rows["steps"]
    assert rows["error_feedback"] is None and rows["delta_points"] == 0.0
    assert "| none-rows | 7 of 7 | 0 | 0 |" in convergence_markdown(res)


def test_rows_options_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="dgc keeps a momentum of its own"):
        check_convergence(ConvergenceOptions(row_sparse=("dgc",)))
    with pytest.raises(ValueError, match="--rows nosuch"):
        check_convergence(ConvergenceOptions(row_sparse=("nosuch",)))
    with pytest.raises(ValueError, match="leave out --fsdp"):
        ConvergenceOptions(fsdp=True, row_sparse=("none",))
    assert main(["bench", "convergence", "--rows", "nosuch"]) == 2
    assert "--rows" in capsys.readouterr().err
