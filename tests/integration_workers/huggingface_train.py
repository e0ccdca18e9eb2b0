"""Hugging Face Trainer runs for tests/test_integrations_huggingface.py, on 2 CPU processes:
``torchrun --nproc-per-node 2 huggingface_train.py OUT``.

A 2-layer GPT-2 (byte vocabulary) trains on CPython's own documentation text twice, from the
same initial weights and batches: with the Trainer's DDP alone (``plain``) and with
:func:`hipress.integrations.huggingface.register` and onebit (``onebit``, saving checkpoints at
steps 5 and 10); then onebit resumed from ``onebit``'s step-5 checkpoint (``resumed``). Each
rank writes ``OUT/<run>-rank<r>.pt``: the log history, the comm hook DDP ran, the final
weights, the last step's bytes. Last, a resume from a copy of that checkpoint whose rank-1
compression state is truncated (``damaged``): each rank writes the error it raised.
"""

from __future__ import annotations

import pydoc_data.topics
import shutil
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import transformers

from hipress.casync import CaSyncError, DefaultRule
from hipress.integrations import huggingface as hipress_hf

STEPS, CONTEXT, BATCH = 10, 32, 8
# the tiny model's matrices have 2048-8192 elements: compress every one of them
RULE = DefaultRule(min_compress_numel=2048)


def dataset() -> list[dict[str, torch.Tensor]]:
    """Windows of CONTEXT bytes of English text, the labels the inputs (the model shifts)."""
    text = " ".join(pydoc_data.topics.topics.values()).encode("ascii", "replace")
    data = torch.tensor(list(text[: CONTEXT * BATCH * 2 * STEPS]), dtype=torch.long)
    return [{"input_ids": w, "labels": w} for w in data.view(-1, CONTEXT)]


def model() -> transformers.GPT2LMHeadModel:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=256, n_positions=CONTEXT, n_embd=32, n_layer=2, n_head=2, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config)


def train(out: Path, name: str, algorithm: str | None, save: bool = False,
          resume: Path | None = None) -> None:  # fmt: skip
    args = transformers.TrainingArguments(
        output_dir=str(out / name), use_cpu=True, ddp_backend="gloo", report_to="none",
        max_steps=STEPS, per_device_train_batch_size=BATCH, learning_rate=3e-3,
        logging_steps=2, save_strategy="steps" if save else "no", save_steps=STEPS // 2,
        disable_tqdm=True, seed=0, dataloader_num_workers=0,
    )  # fmt: skip
    trainer = transformers.Trainer(model=model(), args=args, train_dataset=dataset())
    callback = hipress_hf.register(trainer, algorithm, rule=RULE) if algorithm else None
    trainer.train(resume_from_checkpoint=None if resume is None else str(resume))
    extra: dict[str, Any] = {
        "history": trainer.state.log_history,
        "hook": str(trainer.model_wrapped._get_ddp_logging_data().get("comm_hook", "")),
        "weights": {k: v.detach().clone() for k, v in trainer.model.state_dict().items()},
    }
    if callback is not None and callback.state is not None:
        last = callback.state.stats.last
        extra |= {"sent": last.bytes_sent, "uncompressed": last.bytes_uncompressed}
    torch.save(extra, out / f"{name}-rank{dist.get_rank()}.pt")


def damaged(out: Path) -> None:
    """Resume from a copy of onebit's step-5 checkpoint whose rank-1 file is cut short."""
    folder = out / "damaged" / "checkpoint-5"
    if dist.get_rank() == 0:
        shutil.copytree(out / "onebit" / "checkpoint-5", folder)
        cut = folder / hipress_hf.FILE.format(rank=1)
        cut.write_bytes(cut.read_bytes()[:64])
    dist.barrier()
    try:
        train(out, "damaged", "onebit", resume=folder)
        error = "resumed"
    except CaSyncError as exc:
        error = f"{type(exc).__name__}: {exc}"
    torch.save({"error": error}, out / f"damaged-rank{dist.get_rank()}.pt")


if __name__ == "__main__":
    out = Path(sys.argv[1])
    train(out, "plain", None)
    train(out, "onebit", "onebit", save=True)  # checkpoints at steps 5 and 10
    train(out, "resumed", "onebit", resume=out / "onebit" / "checkpoint-5")
    damaged(out)
