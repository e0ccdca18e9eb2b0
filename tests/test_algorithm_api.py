"""The Algorithm API: validation, buffers, state and the registry."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
import torch

from hipress.compll import BackendError, CllError, algorithms, load
from hipress.compll.ir.state import State


def test_registry_lists_shipped_algorithms() -> None:
    names = algorithms()
    assert "terngrad" in names and "onebit" in names
    with pytest.raises(CllError, match="unknown algorithm 'nope'"):
        load("nope")


def test_encode_validates_inputs() -> None:
    a = load("onebit", backend="reference")
    st = a.init_state(10)
    with pytest.raises(TypeError, match="float32/float16/bfloat16"):
        a.encode(torch.zeros(10, dtype=torch.int32), st)
    with pytest.raises(ValueError, match="state is for 10 elements"):
        a.encode(torch.zeros(11), st)
    with pytest.raises(ValueError, match="out must be a 1-D contiguous uint8 tensor of 24 bytes"):
        a.encode(torch.zeros(10), st, out=torch.empty(3, dtype=torch.uint8))
    with pytest.raises(ValueError, match="payload must be a 1-D contiguous uint8 tensor"):
        a.decode(torch.zeros(3, dtype=torch.uint8), 10)
    with pytest.raises(BackendError, match="unknown backend"):
        load("onebit", backend="tpu")


def test_out_buffers_are_used_and_accumulate() -> None:
    a = load("terngrad", backend="reference", stochastic=False)
    g = torch.randn(100)
    st = a.init_state(100)
    buf = torch.empty(a.payload_nbytes(100), dtype=torch.uint8)
    p = a.encode(g, st, out=buf)
    assert p is buf
    out = torch.ones(100)
    a.decode(p, 100, out=out, accumulate=True)
    assert torch.allclose(out, a.decode(p, 100) + 1)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_an_average_near_the_float32_maximum_stays_finite(backend: str) -> None:
    """Every decode is divided before the sum, as DDP divides each gradient: two workers'
    3e38 average to 3e38, not to Inf."""
    for name in ("bf16", "onebit", "topk"):
        a = load(name, backend=backend)
        x = torch.full((1000,), 3e38)
        p = a.encode(x, a.init_state(1000))
        got = a.decode_sum([p, p], 1000, divide_by=2)
        d = a.decode(p, 1000)
        assert torch.isfinite(got).all() and torch.equal(got, d / 2 + d / 2), name


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_decode_sum_divides_each_decode_then_adds(backend: str) -> None:
    a = load("terngrad", backend=backend)
    n = 5000
    payloads = [a.encode(torch.randn(n), a.init_state(n, seed=k)) for k in range(3)]
    want = a.decode(payloads[0], n) / 3
    for p in payloads[1:]:
        want += a.decode(p, n) / 3
    assert torch.equal(a.decode_sum(payloads, n, divide_by=3), want)
    out = torch.full((n,), 5.0)
    assert a.decode_sum(payloads, n, out=out, divide_by=3) is out  # overwritten, not added to
    assert torch.equal(out, want)
    half = torch.empty(n, dtype=torch.float16)  # computed in float32, rounded once
    assert torch.equal(a.decode_sum(payloads, n, out=half, divide_by=3), want.half())
    with pytest.raises(ValueError, match="at least one payload"):
        a.decode_sum([], n)
    with pytest.raises(ValueError, match="1-D contiguous uint8 tensor of"):
        a.decode_sum([payloads[0], payloads[0][:-8]], n)
    with pytest.raises(ValueError, match="divide_by must be finite and non-zero"):
        a.decode_sum(payloads, n, divide_by=0)
    with pytest.raises(ValueError, match="out must be a float tensor of 5000"):
        a.decode_sum(payloads, n, out=torch.empty(4))


def test_multidim_and_half_inputs() -> None:
    a = load("onebit", backend="reference")
    g = torch.randn(4, 5)
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        st = a.init_state(20)
        p = a.encode(g.to(dt), st)
        assert a.decode(p, 20).shape == (20,)


def test_state_dict_roundtrip_and_pickle() -> None:
    a = load("onebit", backend="reference")
    g = torch.randn(50)
    st = a.init_state(50, seed=3, tensor_id=9)
    a.encode(g, st)
    sd = st.state_dict()
    st2 = a.init_state(50)
    st2.load_state_dict(pickle.loads(pickle.dumps(sd)))
    assert st2.step == 1 and st2.seed == 3 and st2.tensor_id == 9
    assert torch.equal(a.encode(g, st), a.encode(g, st2))
    with pytest.raises(ValueError, match="state is for 50 elements"):
        a.init_state(49).load_state_dict(sd)
    assert isinstance(pickle.loads(pickle.dumps(st)), State)


def test_damaged_state_dicts_are_refused_and_change_nothing() -> None:
    a = load("dgc", backend="reference")
    st = a.init_state(50, seed=3)
    a.encode(torch.randn(50), st)
    good = st.state_dict()
    name = next(k for k, v in good["tensors"].items() if v.dtype == torch.float32)
    before = {k: v.clone() for k, v in st.tensors.items()}
    bad = [
        ([], "a state dict is a dict, got list"),
        ({**good, "step": -1}, "`step` must be an integer >= 0, got -1"),
        ({**good, "seed": 1.5}, "`seed` must be an integer >= 0, got 1.5"),
        ({**good, "n": True}, "`n` must be an integer >= 0, got True"),
        ({**good, "tensors": None}, "`tensors` must be a dict of tensors"),
        ({**good, "tensors": {}}, "state entries do not match"),
        (
            {**good, "tensors": {**good["tensors"], name: torch.zeros(49)}},
            f"state entry `{name}` has shape (49,), this tensor's has (50,)",
        ),
        (
            {**good, "tensors": {**good["tensors"], name: [0.0] * 50}},
            f"state entry `{name}` has shape list",
        ),
        (
            {**good, "tensors": {**good["tensors"], name: torch.zeros(50, dtype=torch.int64)}},
            f"state entry `{name}` is torch.int64, this tensor's is torch.float32",
        ),
    ]
    for sd, msg in bad:
        with pytest.raises(ValueError) as info:
            st.load_state_dict(sd)  # type: ignore[arg-type]
        assert msg in str(info.value)
        assert st.step == 1 and all(torch.equal(before[k], v) for k, v in st.tensors.items())
    half = {k: v.half() if v.is_floating_point() else v for k, v in good["tensors"].items()}
    half = {**good, "tensors": half}
    st.load_state_dict(half)  # a floating checkpoint of another precision loads


def test_stochastic_rounding_depends_on_step_seed_and_tensor() -> None:
    a = load("terngrad", backend="reference")
    g = torch.randn(1000)
    ref = a.encode(g, a.init_state(1000))
    assert torch.equal(ref, a.encode(g, a.init_state(1000)))
    for kw in ({"seed": 1}, {"tensor_id": 1}):
        assert not torch.equal(ref, a.encode(g, a.init_state(1000, **kw)))
    st = a.init_state(1000)
    a.encode(g, st)
    assert not torch.equal(ref, a.encode(g, st))


def test_build_kernels_builds_the_kernels_before_the_first_call(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """build_kernels() compiles (or finds in the cache) what the first call on a device would;
    build_all_kernels does it for several algorithms on parallel threads; the calls then compile
    nothing."""
    from pathlib import Path

    from hipress.compll import build_all_kernels

    monkeypatch.setenv("HIPRESS_CACHE_DIR", str(tmp_path))

    def files() -> set[Path]:
        return {p for p in tmp_path.rglob("*") if p.is_file() and p.suffix != ".lock"}

    algs = [load(name) for name in ("onebit", "terngrad", "topk")]
    assert files() == set()
    build_all_kernels(algs, "cpu")
    built = files()
    assert len(built) >= len(algs)
    for alg in algs:
        x = torch.randn(5000)
        alg.decode(alg.encode(x, alg.init_state(5000)), 5000)
    assert files() == built
    assert algs[0].build_kernels("cpu") is algs[0] and files() == built


def test_build_kernels_for_a_device_the_kernels_cannot_run_on_is_a_clear_error() -> None:
    try:
        import cupy  # type: ignore[import-not-found]  # noqa: F401

        if torch.cuda.is_available():
            pytest.skip("CUDA runs here")
    except ImportError:
        pass
    with pytest.raises(BackendError, match="CUDA backend cannot run here"):
        load("onebit").build_kernels("cuda")


def _recompression_ratio(alg: Any, n: int = 1 << 15, trials: int = 4) -> float:
    """The check recompressible() stands for, measured apart: other seeds and another size."""
    once = twice = 0.0
    for t in range(trials):
        g = torch.randn(n, generator=torch.Generator().manual_seed(500 + t))
        y1 = alg.decode(alg.encode(g, alg.init_state(n, seed=600 + t)), n)
        y2 = alg.decode(alg.encode(y1, alg.init_state(n, seed=700 + t)), n)
        once += float((y1 - g).square().sum())
        twice += float((y2 - g).square().sum())
    return twice / once if once > 0 else 1.0


# every shipped algorithm at its defaults, and settings where compressing twice costs more
RECOMPRESSION_CASES = [(name, {}) for name in algorithms()] + [
    ("randomk", {"memory": False}),
    ("randomk", {"memory": False, "ratio": 0.5}),
    ("qsgd", {"maxnorm": False}),
]


def test_recompressible_agrees_with_the_empirical_check() -> None:
    from hipress.codec.algorithm import RECOMPRESS_VARIANCE_MAX, recompressible, recompression

    verdicts = {}
    for name, params in RECOMPRESSION_CASES:
        alg = load(name, backend="reference", **params)
        measured = _recompression_ratio(alg) <= RECOMPRESS_VARIANCE_MAX
        verdicts[(name, tuple(params.items()))] = measured
        assert recompressible(alg) == measured, (name, params, recompression(alg).reason)
    assert verdicts[("randomk", (("memory", False),))] is False
    assert sum(verdicts.values()) == len(verdicts) - 1


def test_recompression_is_computed_once_per_algorithm_with_its_reason() -> None:
    from hipress.codec.algorithm import recompression

    unbiased = recompression(load("randomk", backend="reference", memory=False))
    # the same specialised program on another backend: the figures already measured
    assert recompression(load("randomk", backend="cpu", memory=False)) is unbiased
    assert not unbiased.ok and unbiased.twice > 10 * unbiased.once
    assert "x the squared error of compressing once (at most 4x)" in unbiased.reason
    assert recompression(load("topk", backend="reference")).ok


def test_an_algorithm_the_probe_cannot_run_counts_as_recompressible() -> None:
    from hipress.codec.algorithm import recompression
    from hipress.core.compression import Uncompressed

    class Broken(Uncompressed):
        def encode(self, grad: torch.Tensor, state: Any, out: Any = None) -> torch.Tensor:
            raise RuntimeError("no encode here")

    r = recompression(Broken())
    assert r.ok and r.failed == "RuntimeError: no encode here"
    assert r.reason.startswith("not measured (RuntimeError: no encode here)")
