"""Train a tiny GPT-2 (``transformers``) with the Hugging Face ``Trainer``, compressed by hipress.

Launch (2 CPU processes on this machine, gloo)::

    torchrun --standalone --nproc-per-node 2 examples/huggingface_train.py --steps 50

The model is built from a config (2 layers, byte vocabulary; nothing is downloaded) and trains
on CPython's own documentation text. :func:`hipress.integrations.huggingface.register` adds the
callback that registers hipress on the Trainer's DDP model and puts ``hipress/bytes_ratio``
and the other metrics into the Trainer's logs (and so into every ``report_to`` integration).
"""

from __future__ import annotations

import argparse
import pydoc_data.topics

import torch
import transformers

from hipress.casync import DefaultRule
from hipress.integrations import huggingface as hipress_hf

CONTEXT = 64


def dataset(samples: int) -> list[dict[str, torch.Tensor]]:
    text = " ".join(pydoc_data.topics.topics.values()).encode("ascii", "replace")
    data = torch.tensor(list(text[: CONTEXT * samples]), dtype=torch.long).view(-1, CONTEXT)
    return [{"input_ids": w, "labels": w} for w in data]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--algorithm", default="onebit")
    args = ap.parse_args()
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=256, n_positions=CONTEXT, n_embd=64, n_layer=2, n_head=2, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    cuda = torch.cuda.is_available()
    targs = transformers.TrainingArguments(
        output_dir="hf_output", use_cpu=not cuda, ddp_backend=None if cuda else "gloo",
        report_to="none", max_steps=args.steps, per_device_train_batch_size=8,
        learning_rate=3e-3, logging_steps=max(args.steps // 5, 1), save_strategy="no",
        disable_tqdm=True,
    )  # fmt: skip
    trainer = transformers.Trainer(
        model=transformers.GPT2LMHeadModel(config), args=targs,
        train_dataset=dataset(16 * args.steps),
    )  # fmt: skip
    # the tiny model's matrices are small: compress every one of at least 4096 elements
    hipress_hf.register(trainer, args.algorithm, rule=DefaultRule(min_compress_numel=4096))
    trainer.train()


if __name__ == "__main__":
    main()
