"""hipress.diloco on CUDA tensors over NCCL (marked cuda: runs wherever a GPU exists): the
codec's kernels on the GPU, non-finite flags kept on the device, the same results as the same
run on CPU/gloo."""

from __future__ import annotations

import diloco_workers as w
import pytest
import torch
from dist_utils import run_workers

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU"),
]


@pytest.mark.parametrize("nan", [False, True])
@pytest.mark.parametrize("algorithm", [None, "onebit", "topk", "int8"])
def test_one_gpu_equals_the_same_run_on_cpu(algorithm, nan: bool) -> None:  # type: ignore[no-untyped-def]
    gpu = run_workers(w.on_device, 1, "cuda", algorithm, nan, backend="nccl", timeout=300)[0]
    cpu = run_workers(w.on_device, 1, "cpu", algorithm, nan, timeout=300)[0]
    for t in range(3):
        for a, b in zip(gpu[t], cpu[t], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, equal_nan=True)
        if nan and t >= 1:
            assert gpu[t][0].isnan().all() if algorithm else gpu[t][0].isnan().any()
    for k in cpu[3]:
        torch.testing.assert_close(gpu[3][k], cpu[3][k], rtol=1e-6, atol=1e-7)
