"""The transformers GPT-2 accuracy job (hipress.bench.convergence_hf): ``hipress plan`` plans
for its model with the default algorithm, keeping the embeddings and 1-D tensors plain, and the
job trains under that plan on 2 gloo processes and reports its validation loss and bytes."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
from integration_launch import launch

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason="no transformers"
)
MODULE = Path(__file__).resolve().parent.parent / "hipress" / "bench" / "convergence_hf.py"


def test_the_100_mbit_plan_compresses_the_matrices_and_the_job_trains_under_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hipress.cli import main
    from hipress.codec.planning import DEFAULT_ALGORITHM

    plan = tmp_path / "plan.json"
    argv = ["plan", "--model", f"{MODULE}:make_model", "--workers", "2", "--bandwidth",
            "100mbit", "--budget", "0.1", "--threads", "1", "--out", str(plan)]  # fmt: skip
    assert main(argv) == 0
    capsys.readouterr()
    saved = json.loads(plan.read_text())
    assert saved["algorithm"] == DEFAULT_ALGORITHM
    compressed = {e["name"] for e in saved["entries"] if e["compress"]}
    assert compressed == {
        f"transformer.h.{i}.{m}.weight"
        for i in range(2)
        for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
    }
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", "-m", "hipress.bench.convergence_hf", "--plan", str(plan), "--steps", "2",
           "--batch", "2"]  # fmt: skip
    out = launch(cmd, tmp_path, "hipress.bench.convergence_hf", timeout=240)
    line = next(x for x in out.splitlines() if x.startswith("RESULT "))
    result = json.loads(line.removeprefix("RESULT "))
    assert result["algorithm"] == DEFAULT_ALGORITHM
    assert set(result["compressed"]) == compressed
    assert math.isfinite(result["valid_loss"]) and result["valid_loss"] < math.log(256) + 1
    # 88% of the elements at qsgd's 4 bits, the rest plain: about a quarter of the bytes
    assert 0.15 < result["bytes_ratio"] < 0.35
