"""``c ? a : b`` between two arrays: the parameter-known condition picks one array when the
program is specialised, so the compiled program holds no trace of the other (not computed when
nothing else reads it) and the reference, C and emulated CUDA agree bit for bit. Misuse
diagnostics are goldens (tests/golden/errors/choice_*.cll)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hipress.compll import Algorithm, SourceFile, load_source
from hipress.compll.backends.cuda.backend import CudaBackend
from hipress.compll.backends.cuda.emu import CxxToolchain, EmulatedRuntime
from hipress.compll.ir.show import show_program

# encode chooses its source and, inside a lambda, a second array; decode chooses a payload field
PROG = """algorithm t;
param feedback: bool = true;
param mode: i32 in {0, 1, 2} = 0;
state residual: f32[n];
payload { q: i8[n]; lo: f32[n]; scale: f32; }
encode(g) {
    let c = map(n, i => g[i] + residual[i]);
    let src = feedback ? c : g;
    let half = map(n, i => src[i] * 0.5);
    let s = reduce(absmax, src);
    let q = map(n, i => i8(round(src[i] / max(s, 1e-30) * 127.0)));
    residual = map(n, i => src[i] - f32(q[i]) * s / 127.0);
    return concat(q, map(n, i => (mode == 1 ? half : (mode == 2 ? g : src))[i]), s);
}
decode(p) {
    let deq = map(n, i => f32(p.q[i]) * p.scale / 127.0);
    let out = mode == 0 ? p.lo : deq;
    return out;
}
"""
SETTINGS = [{"feedback": f, "mode": m} for f in (True, False) for m in (0, 1, 2)]
COMPILED = [{"feedback": False, "mode": 0}, {"feedback": True, "mode": 1}]  # (compiling is slow)


def _algs(params: dict) -> tuple[Algorithm, ...]:
    src = SourceFile("t.cll", PROG)
    ref = load_source(src, backend="reference", **params)
    cpu = load_source(src, backend="cpu", **params)
    if CxxToolchain.detect() is None:
        return ref, cpu
    runtime = EmulatedRuntime(blocks=3, shuffle=True)
    return ref, cpu, Algorithm(ref.program, CudaBackend(ref.program, runtime))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def algs() -> dict[tuple, tuple[Algorithm, ...]]:
    return {tuple(p.values()): _algs(p) for p in COMPILED}


def test_choice_is_resolved_when_compiling() -> None:
    """The program specialised to `feedback = false` never computes or reads `c`."""
    ref = load_source(SourceFile("t.cll", PROG), backend="reference", feedback=False, mode=0)
    text = show_program(ref.program)
    assert "c[" not in text and "let c " not in text and "src" not in text, text
    assert "g[" in text


def test_the_chosen_array_is_read() -> None:
    g = torch.tensor([1.0, -2.0, 4.0])
    for p in SETTINGS:
        ref = load_source(SourceFile("t.cll", PROG), backend="reference", **p)
        st0 = ref.init_state(3)
        st0.tensors["residual"].fill_(0.5)
        lo = ref.encode(g, st0)[8:20].view(torch.float32)
        src = g + 0.5 if p["feedback"] else g
        want = {0: src, 1: src * 0.5, 2: g}[p["mode"]]
        assert torch.equal(lo, want), p


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(st.floats(-1e3, 1e3, width=32), min_size=1, max_size=33),
    st.sampled_from(range(len(COMPILED))),
)
def test_backends_equal_the_reference(
    algs: dict[tuple, tuple[Algorithm, ...]], vals: list[float], k: int
) -> None:
    g = torch.tensor(vals, dtype=torch.float32)
    ref, *others = algs[tuple(COMPILED[k].values())]
    st_ref = ref.init_state(g.numel())
    want = ref.encode(g, st_ref)
    out = ref.decode(want, g.numel())
    for alg in others:
        st_o = alg.init_state(g.numel())
        got = alg.encode(g, st_o).cpu()
        assert torch.equal(got, want)
        assert torch.equal(alg.decode(got, g.numel()).cpu(), out)
