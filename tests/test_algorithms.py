"""Property tests of every shipped algorithm (algorithms/*.cll) on the reference backend.

Each algorithm declares below what it guarantees: an error bound for one encode/decode round
trip, whether it uses error feedback (EF), and whether it is unbiased. The tests hold every
shipped algorithm to its declaration, and to the shared contract: payload size, sizes from 0 to
2**20+3, non-finite inputs stay visible (AMP), half-precision inputs, determinism, state.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from hipress import compll
from hipress.compll import Algorithm, algorithms, shipped_path
from hipress.compll.frontend.check import param_variants
from hipress.compll.frontend.parse import parse
from hipress.compll.ir.payload import unpack
from hipress.compll.ir.source import SourceFile

# The reference interpreter defines what an algorithm computes; native kernels are held to it
# elsewhere. These properties are about the algorithms, so they run on the reference.
BACKEND = "reference"
ALGOS = algorithms()
# error feedback (state `residual`, or `comp` for the one-pass forms of onebit, efsignsgd and
# blocksign):
# residual_after + decoded == g + residual_before
EF = {"blocksign", "dgc", "efsignsgd", "graddrop", "onebit", "randomk", "tbq", "topk"}
# one pass over the data: a non-finite step drops the residual (`lost`) instead of keeping it
ONE_PASS_EF = {"blocksign", "dgc", "efsignsgd", "graddrop", "onebit", "randomk", "tbq", "topk"}
# params under which E[decode(encode(g))] == g
UNBIASED: dict[str, dict[str, Any]] = {
    "qsgd": {},
    "qsgd-2bit": {"bits": 2, "bucket": 64},
    "terngrad": {"clip": 0.0},  # (clipped, it is unbiased on the clipped gradient)
    "randomk": {"ratio": 0.25, "memory": False},
}
RANDOM = {"dgc", "graddrop", "qsgd", "randomk", "terngrad"}
SIZES = (0, 1, 7, 8, 9, 1000)
BIG = (1 << 20) + 3


def load(name: str, **params: Any) -> Algorithm:
    return compll.load(name, backend=BACKEND, **params)


def _eps_tol(ref: torch.Tensor) -> float:
    """A few f32 ulps of the largest magnitude in ``ref``."""
    return 4 * 2.0**-23 * (float(ref.abs().max()) if ref.numel() else 0.0)


def roundtrip(alg: Algorithm, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    st_ = alg.init_state(x.numel())
    p = alg.encode(x, st_)
    return p, alg.decode(p, x.numel())


def fields(alg: Algorithm, p: torch.Tensor, n: int) -> dict[str, torch.Tensor]:
    return {s.name: v for s, v in zip(alg.program.payload, unpack(alg.program, n, p), strict=True)}


# ------------------------------------------------- per-algorithm round-trip bounds (fresh state)
# check(alg, x, payload, y) raises AssertionError when decode(encode(x)) = y breaks the bound.

Check = Callable[[Algorithm, torch.Tensor, torch.Tensor, torch.Tensor], None]


def _k(n: int, frac: float) -> int:
    """The algorithms' k: ceil(n * frac), ignoring rounding noise, at least 1."""
    return max(1, math.ceil(n * frac - 1e-6))


def _per_chunk(
    x: torch.Tensor, size: int, fn: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """``fn`` of each chunk of ``size`` elements (rows of a zero-padded matrix), per element."""
    n = x.numel()
    size = max(1, min(size, n))
    rows = torch.cat([x, x.new_zeros((-n) % size)]).reshape(-1, size)
    return fn(rows).repeat_interleave(size)[:n]


def check_fp16(alg: Algorithm, x: torch.Tensor, p: torch.Tensor, y: torch.Tensor) -> None:
    assert torch.equal(y, x.half().float())
    small = x.abs() <= 65504
    assert (y[small] - x[small]).abs().le(2.0**-11 * x[small].abs() + 2.0**-25).all()
    big = x.abs() >= 65520
    assert torch.isinf(y[big]).all() and torch.equal(y[big].sign(), x[big].sign())


def check_bf16(alg: Algorithm, x: torch.Tensor, p: torch.Tensor, y: torch.Tensor) -> None:
    assert torch.equal(y, x.bfloat16().float())
    fin = torch.isfinite(y)  # near the f32 maximum, rounding up overflows to inf
    assert (y - x)[fin].abs().le(2.0**-8 * x[fin].abs() + 2.0**-134).all()


def check_int8(alg: Algorithm, x: torch.Tensor, p: torch.Tensor, y: torch.Tensor) -> None:
    amax = _per_chunk(x, int(alg.params["chunk"]), lambda r: r.abs().amax(1))
    # (+ 128 ulps of the smallest subnormal: a subnormal scale loses precision)
    assert (y - x).abs().le(amax / 254 * (1 + 1e-5) + 2e-7 * amax + 128 * 2.0**-149).all()
    assert fields(alg, p, x.numel())["q"].abs().le(127).all()


def _scale_sign(x: torch.Tensor, y: torch.Tensor) -> None:
    n = x.numel()
    scale = torch.tensor(float(x.double().abs().sum()) / max(n, 1), dtype=torch.float32)
    want = torch.where(x < 0, -scale, scale)
    torch.testing.assert_close(y, want, rtol=1e-6, atol=0)


def check_signsgd(alg: Algorithm, x: torch.Tensor, p: torch.Tensor, y: torch.Tensor) -> None:
    # the mean |g| of each chunk (the last one may be shorter), with each element's sign
    # (blocksign: the same, of the compensated gradient, which a fresh state makes g)
    n, size = x.numel(), int(alg.params["chunk"])
    counts = _per_chunk(torch.ones(n, dtype=torch.float64), size, lambda r: r.sum(1))
    l1 = _per_chunk(x.double().abs(), size, lambda r: r.sum(1))
    scale = (l1 / counts).float()
    torch.testing.assert_close(y, torch.where(x < 0, -scale, scale), rtol=1e-6, atol=0)


def check_efsignsgd(alg: Algorithm, x: torch.Tensor, p: torch.Tensor, y: torch.Tensor) -> None:
    _scale_sign(x, y)  # fresh state: c == g


def check_onebit(alg: Algorithm, x: torch.Tensor, p: torch.Tensor, y: torch.Tensor) -> None:
    neg = x < 0
    if neg.any():
        torch.testing.assert_close(y[neg], x[neg].double().mean().float().expand(int(neg.sum())))
    if (~neg).any():
        m = x[~neg].double().mean().float().expand(int((~neg).sum()))
        torch.testing.assert_close(y[~neg], m)


def check_tbq(alg: Algorithm, x: torch.Tensor, p: torch.Tensor, y: torch.Tensor) -> None:
    t = torch.tensor(alg.params["threshold"], dtype=torch.float32)
    want = torch.where(x >= t, t, torch.where(x <= -t, -t, torch.zeros_like(x)))
    assert torch.equal(y, want)


def check_topk(alg: Algorithm, x: torch.Tensor, p: torch.Tensor, y: torch.Tensor) -> None:
    n = x.numel()
    k = min(n, _k(n, alg.params["ratio"]))
    idx = fields(alg, p, n)["idx"]
    assert idx.numel() == k and (idx.diff() > 0).all()  # k distinct indices, ascending
    sent = torch.zeros(n, dtype=torch.bool)
    sent[idx] = True
    assert torch.equal(y, torch.where(sent, x, torch.zeros_like(x)))
    if k < n:
        assert x[~sent].abs().max() <= x[sent].abs().min()


def check_randomk(alg: Algorithm, x: torch.Tensor, p: torch.Tensor, y: torch.Tensor) -> None:
    n = x.numel()
    k = min(n, _k(n, alg.params["ratio"]))
    idx = fields(alg, p, n)["idx"]
    assert idx.numel() == k and (idx.diff() > 0).all()
    sent = torch.zeros(n, dtype=torch.bool)
    sent[idx] = True
    # (from a fresh state: with memory, c = x, sent unscaled)
    scale = torch.tensor(1.0 if alg.params["memory"] else n / k if k else 0.0)
    assert torch.equal(y, torch.where(sent, x * scale, torch.zeros_like(x)))


def _check_sampled(
    x: torch.Tensor, p: torch.Tensor, y: torch.Tensor, alg: Algorithm, k: int
) -> None:
    n = x.numel()
    bound = min(n, 2 * k)
    f = fields(alg, p, n)
    count = int(f["count"])
    assert 0 <= count <= bound
    idx = f["idx"][:count]
    assert idx.unique().numel() == count and (f["idx"][count:] == 0).all()
    sent = torch.zeros(n, dtype=torch.bool)
    sent[idx] = True
    assert torch.equal(y, torch.where(sent, x, torch.zeros_like(x)))
    assert (x[sent] != 0).all()
    if count < bound and sent.any():  # nothing cut by the bound: all above the threshold sent
        assert x[~sent].abs().max() < x[sent].abs().min() if (~sent).any() else True


def check_dgc(alg: Algorithm, x: torch.Tensor, p: torch.Tensor, y: torch.Tensor) -> None:
    _check_sampled(x, p, y, alg, _k(x.numel(), alg.params["s_percent"]))
    if alg.params["s_percent"] == 1.0:
        assert torch.equal(y, x)


def check_graddrop(alg: Algorithm, x: torch.Tensor, p: torch.Tensor, y: torch.Tensor) -> None:
    _check_sampled(x, p, y, alg, _k(x.numel(), 1.0 - alg.params["drop_ratio"]))
    if alg.params["drop_ratio"] == 0.0:
        assert torch.equal(y, x)


def check_qsgd(alg: Algorithm, x: torch.Tensor, p: torch.Tensor, y: torch.Tensor) -> None:
    s = (1 << (int(alg.params["bits"]) - 1)) - 1
    if alg.params["maxnorm"]:
        scale = lambda r: r.abs().amax(1)  # noqa: E731
    else:
        scale = lambda r: r.square().sum(1).sqrt()  # noqa: E731
    norm = _per_chunk(x.double(), int(alg.params["bucket"]), scale).float()
    assert (y - x).abs().le(norm / s * (1 + 1e-5) + 4e-7 * norm).all()
    assert (y * x).ge(0).all() and y.abs().le(norm * (1 + 1e-6)).all()


def check_terngrad(alg: Algorithm, x: torch.Tensor, p: torch.Tensor, y: torch.Tensor) -> None:
    if x.numel() == 0:
        return
    lo, hi = (float(p[o : o + 4].view(torch.float32)[0]) for o in (0, 8))  # the payload's
    # the clip range: [min, max] cut to clip standard deviations around the mean (in f64)
    c, xd = float(alg.params["clip"]), x.double()
    mean = xd.mean()
    sd = (xd.square().mean() - mean * mean).clamp(min=0).sqrt()
    want_lo = max(float(x.min()), float(mean - c * sd)) if c > 0 else float(x.min())
    want_hi = min(float(x.max()), float(mean + c * sd)) if c > 0 else float(x.max())
    scale = float(x.abs().max())
    assert abs(lo - want_lo) <= 1e-5 * scale + _eps_tol(x)
    assert abs(hi - want_hi) <= 1e-5 * scale + _eps_tol(x)
    levels = (1 << int(alg.params["bitwidth"])) - 1
    gap = max(0.0, (hi - lo) / levels)
    err = gap if alg.params["stochastic"] else gap / 2
    # + the subnormal spacing per level: a range of a few subnormals has a float32 gap of 0
    # (every element then decodes to lo); elements outside [lo, hi] are clipped first
    tol = err * (1 + 1e-5) + _eps_tol(x) + levels * 2.0**-149
    assert (y - x.clamp(min(lo, hi), hi)).abs().le(tol).all()
    assert y.ge(lo - _eps_tol(x)).all() and y.le(max(lo, hi) + _eps_tol(x)).all()


BOUNDS: dict[str, Check] = {
    "bf16": check_bf16,
    "blocksign": check_signsgd,
    "dgc": check_dgc,
    "efsignsgd": check_efsignsgd,
    "fp16": check_fp16,
    "graddrop": check_graddrop,
    "int8": check_int8,
    "onebit": check_onebit,
    "qsgd": check_qsgd,
    "randomk": check_randomk,
    "signsgd": check_signsgd,
    "tbq": check_tbq,
    "terngrad": check_terngrad,
    "topk": check_topk,
}


def _variants() -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    for name in ALGOS:
        out.append((name, {}))
        module = parse(SourceFile.read(shipped_path(name)))
        out += [(name, v) for v in param_variants(module)]
    out.append(("terngrad", {"stochastic": False}))
    out.append(("tbq", {"threshold": 0.5}))
    return out


VARIANTS = _variants()
VARIANT_IDS = [
    f"{a}-{'-'.join(f'{k}={v}' for k, v in p.items()) or 'default'}" for a, p in VARIANTS
]


def test_declarations_cover_every_shipped_algorithm() -> None:
    assert set(BOUNDS) == set(ALGOS)
    for name in ALGOS:
        alg = load(name)
        assert alg.error_feedback == (name in EF), name
        assert alg.uses_random == (name in RANDOM), name
        text = shipped_path(name).read_text()
        assert text.startswith("//") and len(text.splitlines()) <= 80, name


# ------------------------------------------------------------------------- round-trip bounds

# finite f32 from subnormals to 1e30 (beyond that, norms and ranges leave the f32 range)
_BIGGEST = float(np.float32(1e30))
finite_arrays = hnp.arrays(
    np.float32,
    st.integers(0, 160),
    elements=st.floats(-_BIGGEST, _BIGGEST, width=32),
)


@pytest.mark.parametrize("name", ALGOS)
@settings(max_examples=25, deadline=None)
@given(x=finite_arrays)
def test_roundtrip_bound(name: str, x: np.ndarray) -> None:
    alg = load(name)
    t = torch.from_numpy(x.copy())
    p, y = roundtrip(alg, t)
    assert y.dtype == torch.float32 and y.shape == t.shape
    BOUNDS[name](alg, t, p, y)
    # finite in, finite out (fp16 overflows by design; checked in its bound)
    assert name == "fp16" or torch.isfinite(y).all()


@pytest.mark.parametrize(("name", "params"), VARIANTS, ids=VARIANT_IDS)
def test_roundtrip_bound_param_variants(name: str, params: dict[str, Any]) -> None:
    alg = load(name, **params)
    gen = torch.Generator().manual_seed(1)
    grid = torch.tensor([0.0, 0.01, -0.01, 0.5, -0.5, 1.0, -1.0, 3.0, 0.5, -2.0, 0.0])
    for n in (1, 9, 1000):
        x = torch.randn(n, generator=gen) * 3
        x[::7] = 0.0
        x[: min(n, grid.numel())] = grid[:n]  # exact ties with thresholds and each other
        p, y = roundtrip(alg, x)
        BOUNDS[name](alg, x, p, y)


# ----------------------------------------------------------------------------- error feedback


@pytest.mark.parametrize("name", sorted(EF))
def test_error_feedback_conserves_the_compensated_gradient(name: str) -> None:
    params = {"momentum": 0.0} if name == "dgc" else {}
    alg = load(name, **params)
    n = 500
    gen = torch.Generator().manual_seed(2)
    st_ = alg.init_state(n)
    chunk = int(alg.params.get("chunk", 0)) if name == "blocksign" else 0
    for _ in range(4):
        g = torch.randn(n, generator=gen)
        before = residual(st_, chunk)
        y = alg.decode(alg.encode(g, st_), n)
        c = g + before
        after = residual(st_, chunk)
        torch.testing.assert_close(after + y, c, rtol=0, atol=_eps_tol(c))
        assert after.abs().sum() > 0  # something was held back


def unsent(st_: Any) -> torch.Tensor:
    """For the sparsifiers, which mask a step late: the elements the last step did not send,
    from ``comp`` and (dgc, graddrop) its threshold, rotation and last position taken, or
    (topk) the smallest |c| sent and the last index sent at it; all sent, i.e. nothing kept,
    if it was ``lost``."""
    t = st_.tensors
    comp = t["comp"]
    n = comp.numel()
    i = torch.arange(n)
    last = int(t["plast"])
    if "pmin" in t:
        a = comp.abs()
        sent = (a > t["pmin"]) | ((a == t["pmin"]) & (i <= last))
    else:
        off = int(t["poff"])
        r = torch.where(i < off, i + (n - off), i - off)
        sent = (comp.abs() >= t["pthr"]) & (comp != 0) & (r <= last)
    return ~(sent | bool(t["lost"]))


def residual(st_: Any, chunk: int = 0) -> torch.Tensor:
    """The error-feedback residual an algorithm's state holds: ``residual`` itself, or ``comp``
    minus its decode (``ppos``/``pneg``, or ``pscale``: one per ``chunk`` elements if given),
    or ``comp`` where it was not sent (``pthr``: :func:`unsent`); 0 if the state says it is
    ``lost``."""
    t = st_.tensors
    if "lost" in t and bool(t["lost"]):
        return torch.zeros_like(t["residual" if "residual" in t else "comp"])
    if "residual" in t:
        return t["residual"].clone()
    comp = t["comp"]
    if "pthr" in t or "pmin" in t:
        return torch.where(unsent(st_), comp, torch.zeros_like(comp))
    if "pscale" in t:
        pos = t["pscale"].repeat_interleave(chunk)[: comp.numel()] if chunk else t["pscale"]
        neg = -pos
    else:
        pos, neg = t["ppos"], t["pneg"]
    return comp - torch.where(comp < 0, neg, pos)


@pytest.mark.parametrize("name", sorted(ONE_PASS_EF))
def test_one_pass_error_feedback_drops_the_residual_after_a_non_finite_step(name: str) -> None:
    alg = load(name)
    n = 64
    gen = torch.Generator().manual_seed(5)
    st_ = alg.init_state(n)
    alg.encode(torch.randn(n, generator=gen), st_)
    assert residual(st_).abs().sum() > 0
    bad = torch.randn(n, generator=gen)
    bad[3] = float("nan")
    y = alg.decode(alg.encode(bad, st_), n)
    assert not torch.isfinite(y[3])  # the NaN stays visible: AMP skips the step
    assert bool(st_.tensors["lost"]) and torch.equal(residual(st_), torch.zeros(n))
    g = torch.randn(n, generator=gen)  # the next step starts from zero error
    fresh = alg.init_state(n)
    fresh.step = st_.step  # (the same random draws: randomk's subset depends on the step)
    assert torch.equal(alg.encode(g, st_), alg.encode(g, fresh))
    assert not bool(st_.tensors["lost"])


@pytest.mark.parametrize("name", ["dgc", "graddrop", "topk"])
def test_a_checkpoint_of_the_masked_form_loads_as_the_same_residual(name: str) -> None:
    """Checkpoints written before the sparsifiers kept their state unmasked hold `residual`
    (dgc also `u`): they load with nothing marked sent, so the next step sees that residual."""
    alg = load(name)
    n = 300
    gen = torch.Generator().manual_seed(7)
    r, u = torch.randn(n, generator=gen), torch.randn(n, generator=gen)
    tensors = {"residual": r, **({"u": u} if name == "dgc" else {})}
    st_ = alg.init_state(n, seed=3)
    st_.load_state_dict({"n": n, "step": 5, "seed": 3, "tensor_id": 0, "tensors": tensors})
    assert torch.equal(residual(st_), r) and st_.step == 5
    if name == "dgc":
        assert torch.equal(st_.tensors["u"], u) and bool(unsent(st_).all())
    bad = {"n": n, "step": 0, "seed": 3, "tensor_id": 0, "tensors": {"other": r}}
    with pytest.raises(ValueError, match="state entries do not match"):
        alg.init_state(n).load_state_dict(bad)


@pytest.mark.parametrize("masking", [False, True])
def test_dgc_momentum_correction_and_masking(masking: bool) -> None:
    alg = load("dgc", s_percent=0.05, masking=masking)
    m = torch.tensor(alg.params["momentum"], dtype=torch.float64).float()
    n = 400
    gen = torch.Generator().manual_seed(3)
    st_ = alg.init_state(n)
    for _ in range(4):
        g = torch.randn(n, generator=gen)
        # the state is kept unmasked; what the last step sent starts from zero in v, and in u
        # too with momentum factor masking
        zero = torch.zeros(n)
        kept = unsent(st_)
        u0 = torch.where(kept, st_.tensors["u"], zero) if masking else st_.tensors["u"].clone()
        v0 = torch.where(kept, st_.tensors["comp"], zero)
        y = alg.decode(alg.encode(g, st_), n)
        un = m * u0 + g
        v = v0 + un
        sent = y != 0
        assert 0 < int(sent.sum()) <= 2 * 20
        assert torch.equal(y[sent], v[sent])
        assert torch.equal(st_.tensors["u"], un) and torch.equal(st_.tensors["comp"], v)
        assert torch.equal(unsent(st_), ~sent)


def test_dgc_without_masking_sends_momentum_sgds_updates() -> None:
    # everything sent every step: without masking the sum of what is sent is momentum SGD's
    # update; masking leaves plain SGD's (the momentum of what was sent is dropped)
    n, m = 64, 0.9
    gen = torch.Generator().manual_seed(5)
    grads = [torch.randn(n, generator=gen) for _ in range(5)]
    for masking in (False, True):
        alg = load("dgc", s_percent=1.0, sample_rate=1.0, momentum=m, masking=masking)
        st_ = alg.init_state(n)
        buf = torch.zeros(n)
        for g in grads:
            y = alg.decode(alg.encode(g, st_), n)
            buf = torch.tensor(m, dtype=torch.float32) * buf + g
            want = g if masking else buf
            torch.testing.assert_close(y, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["dgc", "graddrop"])
def test_sampled_threshold_overflow_stays_in_residual(name: str) -> None:
    # every element has the same magnitude: all pass the threshold, only the bound is sent
    params = {"s_percent": 0.01, "momentum": 0.0} if name == "dgc" else {"drop_ratio": 0.99}
    alg = load(name, **params)
    n, bound = 1000, 20
    g = torch.where(torch.arange(n) % 3 == 0, -1.0, 1.0)
    firsts = set()
    for seed in range(4):
        st_ = alg.init_state(n, seed=seed)
        y = alg.decode(alg.encode(g, st_), n)
        sent = (y != 0).nonzero().reshape(-1)
        assert sent.numel() == bound
        assert torch.equal(residual(st_) + y, g)
        firsts.add(int(sent[0]))
    assert len(firsts) > 1  # the cut is not always at the same position


@pytest.mark.parametrize("name", ["dgc", "graddrop"])
def test_nonfinite_after_the_compaction_filled_up(name: str) -> None:
    # the compaction fills up before it reaches the NaN (for most random start offsets): it is
    # still found and sent alone, and the residual is dropped
    params = {"s_percent": 0.01} if name == "dgc" else {"drop_ratio": 0.99}
    alg = load(name, **params)
    n = 1000
    warm = torch.where(torch.arange(n) % 3 == 0, -1.0, 1.0)
    g = warm.clone()
    g[700] = float("nan")
    for seed in range(4):
        st_ = alg.init_state(n, seed=seed)
        alg.encode(warm, st_)  # a residual of +-1 but where sent: all pass again
        assert residual(st_).abs().sum() > 0
        p = alg.encode(g, st_)
        f = fields(alg, p, n)
        assert int(f["count"]) == 1 and int(f["idx"][0]) == 700
        assert bool(st_.tensors["lost"]) and torch.equal(residual(st_), torch.zeros(n))


def test_sampled_threshold_sends_about_k_at_scale() -> None:
    n = 1 << 18
    g = torch.randn(n, generator=torch.Generator().manual_seed(4))
    for name, k in (("dgc", 263), ("graddrop", 2622)):
        alg = load(name)
        y = alg.decode(alg.encode(g, alg.init_state(n)), n)
        assert k / 2 <= int((y != 0).sum()) <= 2 * k, name


# ------------------------------------------------------------------------------- unbiasedness


@pytest.mark.parametrize("case", sorted(UNBIASED))
def test_unbiased(case: str) -> None:
    name = case.split("-")[0]
    z, x = _bias_z(load(name, **UNBIASED[case]))
    assert z.abs().max() < 5.5, float(z.abs().max())
    # no additive bias, and no multiplicative one (which would correlate with sign(x))
    for w in (torch.ones_like(x), x.sign()):
        assert abs(float((z * w).mean())) * math.sqrt(z.numel()) < 5.0


def test_unbiased_statistic_detects_bias() -> None:
    # deterministic TernGrad rounds to nearest: biased, so the same statistic must reject it
    z, _ = _bias_z(load("terngrad", stochastic=False))
    assert z.abs().max() > 10


def _bias_z(alg: Algorithm, n: int = 256, trials: int = 300) -> tuple[torch.Tensor, torch.Tensor]:
    """z-scores of (mean of ``trials`` decodes - x) against a per-element variance bound, for
    the elements of x with a non-zero variance bound; and those elements."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(n, generator=gen) * torch.rand(n, generator=gen)
    st_ = alg.init_state(n, seed=11)
    acc = torch.zeros(n, dtype=torch.float64)
    for _ in range(trials):
        acc += alg.decode(alg.encode(x, st_), n).double()
    assert st_.step == trials
    mean = acc / trials
    if alg.name == "randomk":
        k = _k(n, alg.params["ratio"])
        var = x.double().square() * (n / k - 1)
    elif alg.name == "qsgd":
        s = (1 << (int(alg.params["bits"]) - 1)) - 1
        b = int(alg.params["bucket"])
        if alg.params["maxnorm"]:
            norm = _per_chunk(x.double(), b, lambda r: r.abs().amax(1))
        else:
            norm = _per_chunk(x.double(), b, lambda r: r.square().sum(1).sqrt())
        var = (norm / s).square() / 4
    else:
        gap = float(x.max() - x.min()) / ((1 << int(alg.params["bitwidth"])) - 1)
        var = torch.full((n,), gap * gap / 4, dtype=torch.float64)
    keep = var > 0
    return ((mean - x.double()) / (var / trials).sqrt())[keep], x.double()[keep]


# ------------------------------------------------------------------------- sizes and layout


@pytest.mark.parametrize("name", ALGOS)
def test_sizes_and_payload_layout(name: str) -> None:
    alg = load(name)
    gen = torch.Generator().manual_seed(6)
    for n in SIZES:
        x = torch.randn(n, generator=gen)
        st_ = alg.init_state(n)
        p = alg.encode(x, st_)
        assert p.dtype == torch.uint8 and p.shape == (alg.payload_nbytes(n),)
        assert alg.payload_nbytes(n) % 8 == 0
        y = alg.decode(p, n)
        assert y.shape == (n,) and y.dtype == torch.float32 and torch.isfinite(y).all()
        assert st_.step == 1


@pytest.fixture(scope="module")
def big_grad() -> torch.Tensor:
    return torch.randn(BIG, generator=torch.Generator().manual_seed(7))


@pytest.mark.parametrize("name", ALGOS)
def test_big_tensor(name: str, big_grad: torch.Tensor) -> None:
    alg = load(name)
    p = alg.encode(big_grad, alg.init_state(BIG))
    assert p.numel() == alg.payload_nbytes(BIG)
    y = alg.decode(p, BIG)
    assert y.shape == (BIG,) and torch.isfinite(y).all()
    # the decoded gradient points the same way as the input
    assert float(torch.dot(y, big_grad)) > 0


# ---------------------------------------------------------------------- non-finite visibility


def _nonfinite_cases() -> list[tuple[str, int, list[tuple[int, float]]]]:
    nan, inf = float("nan"), float("inf")
    gen = np.random.default_rng(8)
    cases = []
    for n in (1, 1000, 4099):
        pos = gen.integers(0, n, 3)
        cases.append((f"nan-{n}", n, [(int(pos[0]), nan)]))
        cases.append((f"+inf-{n}", n, [(int(pos[1]), inf)]))
        cases.append((f"-inf-{n}", n, [(int(pos[2]), -inf)]))
    pos = gen.integers(0, 1000, 30)
    cases.append(
        ("mixed-1000", 1000, [(int(p), [nan, inf, -inf][i % 3]) for i, p in enumerate(pos)])
    )
    cases.append(("all-nan-64", 64, [(i, nan) for i in range(64)]))
    return cases


NONFINITE = _nonfinite_cases()


@pytest.mark.parametrize("name", ALGOS)
def test_nonfinite_inputs_stay_visible(name: str) -> None:
    alg = load(name)
    gen = torch.Generator().manual_seed(9)
    for case, n, bad in NONFINITE:
        st_ = alg.init_state(n)
        warm = torch.randn(n, generator=gen)
        alg.encode(warm, st_)  # non-zero error-feedback state
        before = {k: v.clone() for k, v in st_.tensors.items()}
        x = torch.randn(n, generator=gen)
        for i, v in bad:
            x[i] = v
        y = alg.decode(alg.encode(x, st_), n)
        # every non-finite element comes back non-finite (never as a finite number)
        at = torch.tensor([i for i, _ in bad])
        assert not torch.isfinite(y[at]).any(), f"{name} {case}: NaN/Inf came back finite"
        # a non-finite step leaves the state as it was (AMP skips the step); the one-pass
        # error-feedback forms drop their residual instead (no non-finite value stays in use)
        if name in ONE_PASS_EF:
            assert torch.equal(residual(st_), torch.zeros(n)), f"{name} {case}: residual kept"
        else:
            for k, v in st_.tensors.items():
                assert torch.equal(v, before[k]), f"{name} {case}: state {k} changed"
        y2 = alg.decode(alg.encode(torch.randn(n, generator=gen), st_), n)
        assert torch.isfinite(y2).all(), f"{name} {case}: not finite after recovery"


# ------------------------------------------------------------------ dtypes, determinism, state


@pytest.mark.parametrize("name", ALGOS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_gradients(name: str, dtype: torch.dtype) -> None:
    alg = load(name)
    g = torch.randn(3, 37, generator=torch.Generator().manual_seed(10)).to(dtype)
    p_half = alg.encode(g, alg.init_state(g.numel()))
    p_f32 = alg.encode(g.float(), alg.init_state(g.numel()))
    assert torch.equal(p_half, p_f32)
    out = torch.empty_like(g)
    alg.decode(p_half, g.numel(), out=out)
    assert out.shape == g.shape and out.dtype == dtype
    ref = alg.decode(p_half, g.numel())
    assert torch.equal(out.reshape(-1), ref.to(dtype))
    alg.decode(p_half, g.numel(), out=out, accumulate=True)
    assert torch.equal(out.reshape(-1), (ref.to(dtype) + ref.to(dtype)))


@pytest.mark.parametrize("name", ALGOS)
def test_deterministic_and_state_round_trip(name: str) -> None:
    alg = load(name)
    n = 1000
    gen = torch.Generator().manual_seed(12)
    g1, g2 = torch.randn(n, generator=gen), torch.randn(n, generator=gen)
    a, b = alg.init_state(n, seed=3), alg.init_state(n, seed=3)
    assert torch.equal(alg.encode(g1, a), alg.encode(g1, b))
    assert a.step == b.step == 1
    # a checkpointed state resumes exactly
    c = alg.init_state(n, seed=99)
    c.load_state_dict(a.state_dict())
    p = alg.encode(g2, a)
    assert torch.equal(p, alg.encode(g2, c)) and a.step == 2
    if name in RANDOM:  # another seed draws other random numbers
        p3 = alg.encode(g1, alg.init_state(n, seed=3))
        assert not torch.equal(p3, alg.encode(g1, alg.init_state(n, seed=4)))
