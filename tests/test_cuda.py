"""CUDA: every generated kernel compiles with NVRTC for sm_80 and sm_90 (no GPU needed); on a
machine with a GPU (marked `cuda`), the CUDA kernels compute what the reference computes."""

from __future__ import annotations

import pytest
import torch

from hipress.compll import algorithms, load, load_source
from hipress.compll.cache import CompileError
from hipress.compll.source import SourceFile

cuda_mod = pytest.importorskip("hipress.compll.cuda")


def _nvrtc_ok() -> bool:
    try:
        cuda_mod._nvrtc()
        return True
    except cuda_mod.CudaUnavailable:
        return False


needs_nvrtc = pytest.mark.skipif(not _nvrtc_ok(), reason="NVRTC not installed")


@needs_nvrtc
@pytest.mark.parametrize("name", algorithms())
def test_generated_cuda_compiles_for_sm80_and_sm90(name: str) -> None:
    sizes = cuda_mod.compile_check(load(name, backend="reference").program, ("sm_80", "sm_90"))
    assert set(sizes) == {"sm_80", "sm_90"} and all(v > 0 for v in sizes.values())


@needs_nvrtc
@pytest.mark.parametrize("prog", ["scans", "reductions", "casts", "sparse"])
def test_every_op_compiles_for_cuda(prog: str) -> None:
    from test_native import PROGRAMS

    p = load_source(SourceFile(f"{prog}.cll", PROGRAMS[prog]), backend="reference").program
    assert cuda_mod.compile_check(p, ("sm_80",))["sm_80"] > 0


@needs_nvrtc
def test_nvrtc_error_shows_numbered_source() -> None:
    src = 'extern "C" __global__ void k(int* x) {\n  x[0] = ;\n}\n'
    with pytest.raises(CompileError) as exc:
        cuda_mod.nvrtc_compile(src, "sm_80", "bad.cu")
    assert "2 |   x[0] = ;" in str(exc.value)


def _gpu() -> bool:
    return torch.cuda.is_available()


@pytest.mark.cuda
@pytest.mark.skipif(not _gpu(), reason="no CUDA GPU")
@pytest.mark.parametrize("name", algorithms())
def test_cuda_kernel_equals_reference(name: str) -> None:
    from test_native import same_values

    ref = load(name, backend="reference")
    gpu = load(name, backend="cuda")
    for n in (0, 1, 9, 1000, 70_001):
        x = (torch.randint(-64, 64, (n,)).float() / 8).cuda()
        s1 = ref.init_state(n, device="cuda", seed=3)
        s2 = gpu.init_state(n, device="cuda", seed=3)
        for _ in range(2):
            p1, p2 = ref.encode(x, s1), gpu.encode(x, s2)
            assert torch.equal(p1, p2), f"{name} n={n}"
            for k in s1.tensors:
                assert same_values(s1.tensors[k].cpu(), s2.tensors[k].cpu())
            assert same_values(ref.decode(p1, n).cpu(), gpu.decode(p1, n).cpu())
