"""CUDA: every generated kernel compiles with NVRTC for sm_80 and sm_90 (no GPU needed), with
options that keep IEEE float32 (no flush-to-zero, no approximations: checked in the PTX); on a
machine with a GPU (marked `cuda`), the CUDA kernels compute what the reference computes, never
wait for the device, and keep calls on different streams apart. (Without a GPU the same
kernels and host code run on the CPU emulator: tests/test_cuda_emu.py.)"""

from __future__ import annotations

import pytest
import torch
from cuda_marks import needs_nvrtc

from hipress.compll import algorithms, load, load_source
from hipress.compll.backends.cache import CompileError
from hipress.compll.ir.source import SourceFile

cuda_mod = pytest.importorskip("hipress.compll.backends.cuda.backend")




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


@needs_nvrtc
@pytest.mark.parametrize("name", algorithms())
def test_what_the_runtime_compiles_keeps_ieee_float32(name: str, tmp_path: object) -> None:
    """The GPU runtime's own compile path (:func:`device_image`, its options and nothing else)
    gives PTX without flush-to-zero or approximate float32 instructions: the kernels compute
    what the reference and the emulator compute. (A GPU newer than any architecture NVRTC
    knows gets PTX: compute capability 9.5 here, so the image is the PTX itself.)"""
    from hipress.compll.backends.cache import KernelCache
    from hipress.compll.backends.cuda.nvrtc import device_image, semantic_flags, target_for
    from hipress.compll.backends.cuda.render import cuda_source

    assert target_for((9, 5)) == ("sm_90", False)
    src = cuda_source(load(name, backend="reference").program).source
    ptx = device_image(src, (9, 5), cache=KernelCache(tmp_path))  # type: ignore[arg-type]
    assert ptx.lstrip().startswith(b"//") and b".target sm_90" in ptx
    assert semantic_flags(ptx) == []


@needs_nvrtc
def test_the_ptx_check_catches_flush_to_zero() -> None:
    """What CuPy's RawModule compiles with (our options, then -ftz=true) flushes denormals:
    the check above would fail on it."""
    from hipress.compll.backends.cuda.nvrtc import NVRTC_OPTIONS, semantic_flags
    from hipress.compll.backends.cuda.render import cuda_source

    src = cuda_source(load("onebit", backend="reference").program).source
    flags = semantic_flags(cuda_mod.nvrtc_compile(src, "sm_90", options=(*NVRTC_OPTIONS,
                                                                          "-ftz=true")))  # fmt: skip
    assert flags and all(".ftz" in f for f in flags)
    fast = semantic_flags(cuda_mod.nvrtc_compile(src, "sm_90", options=("--use_fast_math",)))
    assert any(".approx" in f or ".ftz" in f for f in fast)


@needs_nvrtc
def test_device_images_are_compiled_once_and_kept_across_processes(tmp_path: object) -> None:
    """A cubin for the GPU's own architecture, from the kernel cache after the first compile:
    a fresh process (a fresh cache object on the same directory) compiles nothing."""
    from hipress.compll.backends.cache import KernelCache
    from hipress.compll.backends.cuda.nvrtc import device_image
    from hipress.compll.backends.cuda.render import cuda_source

    src = cuda_source(load("onebit", backend="reference").program).source
    first = KernelCache(tmp_path)  # type: ignore[arg-type]
    img = device_image(src, (9, 0), cache=first)
    assert first.compiles == 1 and img[:4] == b"\x7fELF"  # a cubin
    again = KernelCache(tmp_path)  # type: ignore[arg-type]
    assert device_image(src, (9, 0), cache=again) == img and again.compiles == 0
    other = device_image(src, (8, 0), cache=again)
    assert again.compiles == 1 and other != img


@needs_nvrtc
def test_a_gpu_older_than_nvrtc_supports_is_a_clear_error() -> None:
    from hipress.compll.backends.cuda.nvrtc import supported_archs, target_for

    oldest = supported_archs()[0]
    with pytest.raises(cuda_mod.CudaUnavailable, match=r"compute capability .* this GPU is"):
        target_for((oldest // 10 - 1, 0))


def _gpu() -> bool:
    return torch.cuda.is_available()


needs_gpu = pytest.mark.skipif(not _gpu(), reason="no CUDA GPU")


def run_on_gpu(name: str, x: torch.Tensor, steps: int = 2, **params: object) -> None:
    """The CUDA kernels on ``x`` (on the GPU) against the reference on the CPU: payload bytes,
    state, decode, decode-accumulate and decode_sum."""
    from test_native import same_values

    ref = load(name, backend="reference", **params)
    dev = load(name, backend="cuda", **params)
    n = x.numel()
    s1 = ref.init_state(n, seed=3, tensor_id=5)
    s2 = dev.init_state(n, seed=3, tensor_id=5, device="cuda")
    sent = []
    for step in range(steps):
        p1, b1 = ref.encode_checked(x.cpu(), s1)
        p2, b2 = dev.encode_checked(x.cuda(), s2)
        assert torch.equal(p1, p2.cpu()), f"{name} n={n} step {step}: payload"
        if b2 is not None:
            assert bool(b2) == bool(b1), f"{name}: NaN/Inf flag"
        for k in s1.tensors:
            assert same_values(s1.tensors[k], s2.tensors[k].cpu()), f"{name}: state {k}"
        for acc in (False, True):
            o1 = torch.linspace(-1, 1, n)
            o2 = o1.cuda()
            ref.decode(p1, n, o1, accumulate=acc)
            dev.decode(p1.cuda(), n, o2, accumulate=acc)
            assert same_values(o1, o2.cpu()), f"{name}: decode(accumulate={acc})"
        sent.append(p1)
    for div in (1, len(sent), 3.0):
        got = dev.decode_sum([p.cuda() for p in sent], n, divide_by=div)
        assert same_values(ref.decode_sum(sent, n, divide_by=div), got.cpu()), f"{name}: sum"


@pytest.mark.cuda
@needs_gpu
@pytest.mark.parametrize("name", algorithms())
@pytest.mark.parametrize("n", [0, 1, 9, 1000, 70_001, 600_001])
def test_cuda_kernel_equals_reference(name: str, n: int) -> None:
    g = torch.Generator().manual_seed(n)
    x = torch.randint(-64, 64, (n,), generator=g).float() / 8
    if n > 100:
        x[::97] = -0.0
        x[5::101] = 2.0**-140
    run_on_gpu(name, x)
    if n > 100:
        x[n // 2] = float("nan")
        run_on_gpu(name, x, steps=1)


@pytest.mark.cuda
@needs_gpu
@pytest.mark.parametrize("name", algorithms())
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, "strided"])
def test_cuda_half_and_strided_gradients(name: str, dtype: object) -> None:
    x = torch.randint(-64, 64, (2 * 70_001,), generator=torch.Generator().manual_seed(1)) / 8
    x = x.float()[::2] if dtype == "strided" else x[:70_001].to(dtype)  # type: ignore[arg-type]
    run_on_gpu(name, x)


@pytest.mark.cuda
@needs_gpu
@pytest.mark.parametrize("name", ["onebit", "topk", "dgc", "randomk", "terngrad", "int8"])
def test_cuda_calls_never_wait_for_the_device(name: str) -> None:
    alg = load(name, backend="cuda")
    n = 1 << 20
    x = torch.randn(n, device="cuda")
    st = alg.init_state(n, device="cuda")
    out = torch.empty(n, device="cuda")
    p = alg.encode(x, st)  # (the first calls compile and allocate)
    alg.decode(p, n, out)
    alg.decode_sum([p, p], n, out=out, divide_by=2)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        alg.encode_checked(x, st, out=p)
        alg.decode(p, n, out)
        alg.decode(p, n, out, accumulate=True)
        alg.decode_sum([p, p], n, out=out, divide_by=2)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.cuda
@needs_gpu
def test_cuda_calls_on_two_streams_do_not_share_buffers() -> None:
    alg = load("topk", backend="cuda")
    n = 1 << 20
    xs = [torch.randn(n, device="cuda", generator=torch.Generator("cuda").manual_seed(k))
          for k in range(2)]  # fmt: skip
    want = [alg.decode(alg.encode(x, alg.init_state(n, device="cuda")), n) for x in xs]
    streams = [torch.cuda.Stream() for _ in xs]
    got = []
    torch.cuda.synchronize()
    for x, s in zip(xs, streams, strict=True):
        with torch.cuda.stream(s):
            got.append(alg.decode(alg.encode(x, alg.init_state(n, device="cuda")), n))
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))


@pytest.mark.cuda
@needs_gpu
def test_cuda_runs_on_the_tensors_device() -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs")
    alg = load("onebit", backend="cuda")
    x = torch.randn(5000, device="cuda:1")
    with torch.cuda.device(0):
        p = alg.encode(x, alg.init_state(5000, device="cuda:1"))
    ref = load("onebit", backend="reference")
    assert torch.equal(p.cpu(), ref.encode(x.cpu(), ref.init_state(5000)))


@pytest.mark.cuda
@needs_gpu
def test_auto_runs_cuda_tensors_on_the_cuda_kernels() -> None:
    alg = load("onebit")
    assert alg.backend.backend_for(torch.device("cuda")).name == "cuda"  # type: ignore[attr-defined]


def test_cuda_tensors_never_fall_back_to_the_reference() -> None:
    """backend="auto" on CUDA tensors runs the CUDA kernels or fails with the cause and the fix;
    never the reference interpreter, silently, on the GPU."""
    from hipress.compll import BackendError

    auto = load("onebit").backend
    try:
        import cupy  # type: ignore[import-not-found]  # noqa: F401

        have_cupy = True
    except ImportError:
        have_cupy = False
    if _gpu() and have_cupy:
        assert auto.backend_for(torch.device("cuda")).name == "cuda"  # type: ignore[attr-defined]
        return
    with pytest.raises(BackendError, match=r"CUDA backend cannot run here: .*pip install"):
        auto.backend_for(torch.device("cuda"))  # type: ignore[attr-defined]
