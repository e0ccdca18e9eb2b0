"""hipress.integrations.huggingface in real Hugging Face Trainer runs: a 2-layer GPT-2 from
``transformers`` on 2 CPU processes (gloo), launched with torchrun. One launch of
tests/integration_workers/huggingface_train.py trains the Trainer's DDP alone and with onebit,
from the same weights and batches."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from integration_launch import launch

pytest.importorskip("transformers")

import transformers

from hipress.casync import CaSyncError
from hipress.integrations import huggingface as hipress_hf

WORKER = Path(__file__).parent / "integration_workers" / "huggingface_train.py"
RANKS = (0, 1)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("huggingface")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--standalone", str(WORKER), str(out)]  # fmt: skip
    launch(cmd, out, "the Trainer runs", timeout=240)
    return {**{p.stem: torch.load(p, weights_only=False) for p in out.glob("*.pt")}, "_out": out}


def _losses(run: dict[str, Any]) -> list[float]:
    return [e["loss"] for e in run["history"] if "loss" in e]


@pytest.mark.parametrize("rank", RANKS)
def test_the_callback_registers_on_the_trainers_ddp_model(runs: dict[str, Any], rank: int) -> None:
    assert runs[f"plain-rank{rank}"]["hook"] == ""
    onebit = runs[f"onebit-rank{rank}"]
    assert onebit["hook"] == "casync_hook"
    assert onebit["sent"] * 2 < onebit["uncompressed"]


@pytest.mark.parametrize("rank", RANKS)
def test_the_trainers_logs_hold_the_metrics(runs: dict[str, Any], rank: int) -> None:
    logs = [e for e in runs[f"onebit-rank{rank}"]["history"] if "loss" in e]
    assert len(logs) == 5  # (10 steps, logging_steps=2)
    assert [e["hipress/step"] for e in logs] == [1, 3, 5, 7, 9]
    for e in logs:
        assert 0 < e["hipress/bytes_ratio"] < 0.5
        assert e["hipress/compressed_tensors"] >= 1 and e["hipress/encode_ms"] > 0
    assert not any(k.startswith("hipress/") for e in runs[f"plain-rank{rank}"]["history"]
                   for k in e)  # fmt: skip


def test_the_loss_falls_as_without_compression(runs: dict[str, Any]) -> None:
    plain, onebit = _losses(runs["plain-rank0"]), _losses(runs["onebit-rank0"])
    assert onebit[-1] < onebit[0] - 0.3
    assert abs(onebit[-1] - plain[-1]) < 0.02 * plain[-1]
    assert onebit != plain  # (compressed: not the same numbers)


def test_the_checkpoints_hold_every_ranks_compression_state(runs: dict[str, Any]) -> None:
    for step in (5, 10):
        files = sorted(p.name for p in (runs["_out"] / "onebit" / f"checkpoint-{step}").glob(
            "hipress_*"))  # fmt: skip
        assert files == ["hipress_casync_rank0.pt", "hipress_casync_rank1.pt"], (step, files)
        sd = torch.load(runs["_out"] / "onebit" / f"checkpoint-{step}" / files[1],
                        weights_only=True)  # fmt: skip
        assert sd["rank"] == 1 and sd["world_size"] == 2


@pytest.mark.parametrize("rank", RANKS)
def test_a_resumed_run_is_bit_exact(runs: dict[str, Any], rank: int) -> None:
    """From the step-5 checkpoint to step 10: the same weights, bit for bit, and the same
    losses, as the run that did not stop (with error feedback restarted from zero, they
    differ)."""
    whole, resumed = runs[f"onebit-rank{rank}"], runs[f"resumed-rank{rank}"]
    for k, v in whole["weights"].items():
        assert torch.equal(v, resumed["weights"][k]), k

    def late(run: dict[str, Any]) -> list[tuple[int, float, int]]:
        # (the log of step 6 covers steps 5-6 in the whole run, step 6 alone in the resumed)
        return [(e["step"], e["loss"], e["hipress/step"]) for e in run["history"]
                if "loss" in e and e["step"] > 6]  # fmt: skip

    assert late(resumed) == late(whole) and len(late(whole)) == 2  # (hipress/step too)


def test_a_damaged_compression_state_stops_every_rank(runs: dict[str, Any]) -> None:
    # rank 1 cannot read its file: it raises its own error, and rank 0, which could restore,
    # raises too, naming rank 1 and why, instead of training on alone
    folder = runs["_out"] / "damaged" / "checkpoint-5"
    why = f"{folder / 'hipress_casync_rank1.pt'}: not a readable checkpoint (truncated"
    mine, other = runs["damaged-rank1"]["error"], runs["damaged-rank0"]["error"]
    assert mine.startswith(f"CaSyncError: {why}"), mine
    assert other.startswith(
        f"CaSyncError: restoring the compression state from {folder} failed on rank 1; resume "
        f"from a checkpoint every rank can read:\n  rank 1: CaSyncError: {why}"
    ), other


def test_a_trainer_without_ddp_is_refused(tmp_path: Path) -> None:
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=16, n_positions=8, n_embd=8, n_layer=1, n_head=1, bos_token_id=0,
        eos_token_id=0,
    ))  # fmt: skip
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True,
                                          report_to="none")  # fmt: skip
    trainer = transformers.Trainer(model=model, args=args)
    callback = hipress_hf.register(trainer, "onebit")
    assert trainer.callback_handler.callbacks[0] is callback
    with pytest.raises(CaSyncError, match="wrapped in DistributedDataParallel, got a GPT2LMHead"):
        callback.on_train_begin(args, trainer.state, trainer.control)


def test_process_group_option_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CaSyncError, match="process_group"):
        hipress_hf.HipressTrainerCallback(None, "onebit", process_group=object())  # type: ignore[arg-type]
    with pytest.raises(CaSyncError, match="shapes must be 'all', 'matrices'"):  # when built
        hipress_hf.HipressTrainerCallback(None, "onebit", shapes="vectors")  # type: ignore[arg-type]
