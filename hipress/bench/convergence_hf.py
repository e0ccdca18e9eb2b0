"""Validation loss of a Hugging Face GPT-2 trained the way people train transformers, under DDP
and under a hipress plan: the accuracy check behind the advice on plans for AdamW.

The job: ``transformers.GPT2LMHeadModel`` built from a config (2 layers, width 128, 4 heads,
byte vocabulary, context 128, dropout off, tied embeddings; nothing is downloaded) on CPython's
documentation text (``pydoc_data.topics``, the last 10% held out), AdamW (weight decay 0.01),
bf16 autocast, gradient norm clipped to 1, ``accum`` micro-batches per step with ``no_sync`` on
all but the last, a linear warm-up of 10 steps then a cosine decay to 0. Every configuration
draws the same batches (one generator per seed, every rank draws every rank's windows) and the
same initial weights, so validation losses compare one for one.

Run one configuration per launch, on the CPU (gloo)::

    torchrun --nproc-per-node 2 -m hipress.bench.convergence_hf --plan ddp
    hipress plan --model hipress/bench/convergence_hf.py:make_model --workers 2 \\
        --bandwidth 100mbit --threads 1 --out plan.json
    torchrun --nproc-per-node 2 -m hipress.bench.convergence_hf --plan plan.json

``--plan`` is ``ddp`` (no hipress), ``default`` (the default rule), ``auto`` or a plan file;
``--algorithm`` overrides the plan's; ``--warmup-steps`` is CaSync's uncompressed warm-up.
Rank 0 prints one line ``RESULT {json}`` with the validation loss and CaSync's bytes ratio.
Needs ``transformers`` (``pip install 'hipress[huggingface]'``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["CONTEXT", "make_model", "text_tokens", "train"]

CONTEXT = 128


def make_model() -> torch.nn.Module:
    """The GPT-2 of this benchmark (random weights from the current torch seed)."""
    import transformers

    config = transformers.GPT2Config(
        vocab_size=256, n_positions=CONTEXT, n_embd=128, n_layer=2, n_head=4, bos_token_id=0,
        eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config)


def text_tokens() -> tuple[torch.Tensor, torch.Tensor]:
    """``(train, valid)`` byte tokens of CPython's documentation topics (90% / 10%)."""
    import pydoc_data.topics

    text = " ".join(pydoc_data.topics.topics.values()).encode("ascii", "replace")
    tokens = torch.tensor(list(text), dtype=torch.long)
    cut = int(len(tokens) * 0.9)
    return tokens[:cut], tokens[cut:]


def _schedule(steps: int) -> Any:
    warm = max(1, min(10, steps // 10))
    return lambda s: (
        (s + 1) / warm
        if s < warm
        else 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, steps - warm)))
    )


def _valid_loss(model: torch.nn.Module, valid: torch.Tensor) -> float:
    model.eval()
    n = (len(valid) - 1) // CONTEXT
    windows = valid[: n * CONTEXT].view(n, CONTEXT)
    total = 0.0
    with torch.no_grad():
        for i in range(0, n, 32):
            x = windows[i : i + 32]
            total += float(model(input_ids=x, labels=x).loss) * len(x)
    return total / n


def _register(ddp: Any, args: argparse.Namespace) -> Any:
    import hipress.casync

    plan = None if args.plan == "default" else args.plan
    kwargs: dict[str, Any] = {"plan": plan, "warmup_steps": args.warmup_steps}
    if args.algorithm is None and plan not in (None, "auto"):
        kwargs["algorithm"] = json.loads(Path(plan).read_text())["algorithm"]
    elif args.algorithm is not None:
        kwargs["algorithm"] = args.algorithm
    return hipress.casync.register(ddp, **kwargs)


def train(args: argparse.Namespace) -> dict[str, Any]:
    """One configuration on the initialised process group; the result of rank 0's view."""
    from torch.nn.parallel import DistributedDataParallel

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    model = make_model()
    ddp = DistributedDataParallel(model)
    state = None if args.plan == "ddp" else _register(ddp, args)
    opt = torch.optim.AdamW(ddp.parameters(), lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _schedule(args.steps))
    train_tokens, valid = text_tokens()
    gen = torch.Generator().manual_seed(1000 + args.seed)
    start = time.perf_counter()
    for _ in range(args.steps):
        shape = (args.accum, world, args.batch)
        offsets = torch.randint(0, len(train_tokens) - CONTEXT - 1, shape, generator=gen)
        for m in range(args.accum):
            x = torch.stack([train_tokens[o : o + CONTEXT] for o in offsets[m, rank].tolist()])
            last = m == args.accum - 1
            with contextlib.nullcontext() if last else ddp.no_sync():
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = ddp(input_ids=x, labels=x).loss / args.accum
                loss.backward()
        torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
    out: dict[str, Any] = {
        "plan": args.plan, "seed": args.seed, "steps": args.steps, "lr": args.lr,
        "warmup_steps": args.warmup_steps, "seconds": time.perf_counter() - start,
        "valid_loss": _valid_loss(model, valid),
    }  # fmt: skip
    if state is not None:
        metrics = state.metrics()
        out["algorithm"] = state.plan.algorithm
        out["bytes_ratio"] = metrics.get("hipress/bytes_ratio")
        out["compressed"] = [e.name for e in state.plan.entries if e.compress]
        state.close()
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", default="ddp", help="ddp, default, auto or a plan file")
    ap.add_argument("--algorithm", default=None, help="CompLL algorithm (default: the plan's)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=8, help="windows per micro-batch per rank")
    ap.add_argument("--accum", type=int, default=2, help="micro-batches per step")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup-steps", type=int, default=0, help="CaSync's uncompressed steps")
    args = ap.parse_args(argv)
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    try:
        out = train(args)
        if dist.get_rank() == 0:
            print("RESULT " + json.dumps(out), flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
