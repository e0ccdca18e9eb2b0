"""Worker for tests/test_rowsparse_horovod.py: run under ``horovodrun -np 2 --gloo``.

Row-sparse entries over Horovod, on a plain ``nn.Embedding`` beside a dense layer: exact mode
equals ``hvd.DistributedOptimizer`` (rows shared by the ranks, a step denser than the bound,
steps where one or both ranks touch no row); compressed mode's error feedback keeps the sum.
Prints ``CHECK <name> ok`` or ``CHECK <name> FAIL <why>``; exits 1 if any failed.
"""

from __future__ import annotations

import sys
import traceback

import horovod.torch as hvd
import torch
from torch import nn

import hipress.horovod
from hipress.codec.rowsparse import row_state_key
from hipress.core.plan import Plan, Strategy, TensorPlan

ROWS, DIM, BOUND, STEPS = 64, 8, 6, 5


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(ROWS, DIM)
        self.out = nn.Linear(DIM, 4)

    def forward(self, tok: torch.Tensor, scale: float) -> torch.Tensor:
        if scale == 0:  # no row touched: the gradient is +0.0 everywhere
            return self.out(torch.zeros(*tok.shape, DIM)) + self.emb.weight[:0].sum()
        return self.out(self.emb(tok) * scale)


def backward(m: Net, step: int) -> None:
    rank = hvd.rank()
    tok = torch.tensor([[3, 5, 10 + rank, 10 + 2 * rank]])
    if step == 2 and rank == 0:
        tok = torch.arange(20).view(2, 10)  # denser than the bound
    scale = 0.0 if step == 4 or (step == 3 and rank == 1) else 1.0
    m(tok, scale).square().sum().backward()


def plan(algorithm: str, compress: bool) -> Plan:
    s = Strategy.ALLGATHER if compress else Strategy.ALLREDUCE
    return Plan(algorithm, {}, hvd.size(), (
        TensorPlan("emb.weight", ROWS * DIM, compress, s, rows=ROWS, row_bound=BOUND),
        TensorPlan("out.weight", DIM * 4, False, Strategy.ALLREDUCE),
        TensorPlan("out.bias", 4, False, Strategy.ALLREDUCE),
    ))  # fmt: skip


def check_exact_equals_horovod() -> None:
    plain, ours = Net(), Net()
    opt_h = hvd.DistributedOptimizer(torch.optim.SGD(plain.parameters(), lr=0.1),
                                     named_parameters=plain.named_parameters())  # fmt: skip
    opt_o = hipress.horovod.DistributedOptimizer(
        torch.optim.SGD(ours.parameters(), lr=0.1), named_parameters=ours.named_parameters(),
        algorithm="onebit", plan=plan("onebit", False),
    )  # fmt: skip
    for step in range(STEPS):
        for m, opt in ((plain, opt_h), (ours, opt_o)):
            opt.zero_grad()
            backward(m, step)
            opt.step()
        for (n, a), b in zip(plain.named_parameters(), ours.parameters(), strict=True):
            if not torch.equal(a.data, b.data):
                raise AssertionError(f"step {step}: {n} differs from Horovod's")


def check_feedback_keeps_the_sum() -> None:
    ref, ours = Net(), Net()
    opt = hipress.horovod.DistributedOptimizer(
        torch.optim.SGD(ours.parameters(), lr=0.0), named_parameters=ours.named_parameters(),
        algorithm="topk", params={"ratio": 0.25}, plan=plan("topk", True),
    )  # fmt: skip
    synced, true = torch.zeros(ROWS, DIM), torch.zeros(ROWS, DIM)
    for step in range(STEPS):
        opt.zero_grad()
        backward(ours, step)
        opt.step()
        synced += ours.emb.weight.grad
        ref.zero_grad()
        backward(ref, step)
        true += hvd.allreduce(ref.emb.weight.grad, op=hvd.Average, name=f"true.{step}")
    sync = opt.hipress_sync
    res = sync.worker_states[row_state_key("emb.weight")].tensors["residual"]
    mean_res = hvd.allreduce(res, op=hvd.Average, name="res").view(ROWS, DIM)
    err = (synced + mean_res - true).abs().max().item()
    if not err < 1e-5 or not mean_res.abs().max() > 1e-3:  # (topk left something out)
        raise AssertionError(f"sum off by {err}, mean residual max {mean_res.abs().max()}")


def main() -> int:
    hvd.init()
    failed = 0
    for name, fn in [("exact_equals_horovod", check_exact_equals_horovod),
                     ("feedback_keeps_the_sum", check_feedback_keeps_the_sum)]:  # fmt: skip
        try:
            fn()
            print(f"CHECK {name} ok", flush=True)
        except Exception as exc:
            failed += 1
            print(f"CHECK {name} FAIL {exc!r}\n{traceback.format_exc()}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
