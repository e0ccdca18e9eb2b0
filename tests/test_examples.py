"""Every launcher's example in examples/ runs, a few steps on 2 CPU processes (gloo), as its
docstring says to launch it, and compresses: each prints or logs its bytes ratio."""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch
from integration_launch import launch, run

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
STEPS = ["--steps", "3"]
RATIO = re.compile(r"bytes sent (\d+\.\d)%|'hipress/bytes_ratio': '?([\d.e-]+)")


def _needs(module: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(importlib.util.find_spec(module) is None, reason=f"no {module}")


CASES = [
    pytest.param([*TORCHRUN, "torchrun_ddp.py", *STEPS], id="torchrun-ddp"),
    pytest.param([*TORCHRUN, "fsdp2_train.py", *STEPS], id="torchrun-fsdp2"),
    pytest.param([sys.executable, "lightning_train.py", *STEPS], id="lightning-ddp",
                 marks=_needs("lightning")),
    pytest.param([sys.executable, "lightning_train.py", *STEPS, "--strategy", "fsdp2"],
                 id="lightning-fsdp2", marks=_needs("lightning")),
    pytest.param([*TORCHRUN, "accelerate_train.py", *STEPS], id="accelerate",
                 marks=_needs("accelerate")),
    pytest.param([*TORCHRUN, "huggingface_train.py", *STEPS], id="huggingface",
                 marks=_needs("transformers")),
    pytest.param([*TORCHRUN, "diloco_train.py", "--steps", "8", "--sync-every", "2"],
                 id="diloco"),
]  # fmt: skip


def _ratios(out: str) -> list[float]:
    found = []
    for pct, ratio in RATIO.findall(out):
        found.append(float(pct) / 100 if pct else float(ratio))
    return found


@pytest.mark.parametrize("command", CASES)
def test_the_example_runs_and_compresses(command: list[str], tmp_path: Path) -> None:
    script = next(a for a in command if a.endswith(".py"))
    shutil.copy(EXAMPLES / script, tmp_path / script)  # (it writes logs beside it)
    out = launch(command, tmp_path, f"examples/{script}", timeout=240)
    if script == "diloco_train.py":
        assert "step 8: loss" in out, out[-3000:]
        return
    ratios = _ratios(out)
    assert ratios, out[-3000:]
    assert all(0 < r < 0.5 for r in ratios), ratios


@_needs("horovod")
def test_the_horovod_example_runs(tmp_path: Path) -> None:
    horovodrun = Path(sys.executable).parent / "horovodrun"
    out = launch([str(horovodrun), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable,
                  str(EXAMPLES / "horovod_train.py"), "--steps", "3"], tmp_path,
                 "examples/horovod_train.py", timeout=240)  # fmt: skip
    assert "loss" in out


def test_accelerate_fsdp2_on_cpus_says_what_it_refuses(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU machine runs the FSDP2 plugin")
    shutil.copy(EXAMPLES / "accelerate_train.py", tmp_path)
    rc, out = run([sys.executable, "accelerate_train.py", "--fsdp2"], tmp_path, "--fsdp2")
    assert rc != 0 and "FSDP plugin on GPUs only" in out


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (NCCL)")
def test_accelerate_fsdp2_plugin_route(tmp_path: Path) -> None:
    shutil.copy(EXAMPLES / "accelerate_train.py", tmp_path)
    out = launch([*TORCHRUN, "accelerate_train.py", *STEPS, "--fsdp2"], tmp_path,
                 "accelerate --fsdp2", timeout=240)  # fmt: skip
    assert all(0 < r < 0.5 for r in _ratios(out)) and _ratios(out)
