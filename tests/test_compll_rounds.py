"""Multi-round CompLL algorithms: named payloads, one encode per round reading the earlier
rounds' sums, a decode over every sum. The reference interpreter runs each stage; the C and
emulated CUDA kernels give its bytes (a two-round program with scalar and array fields, under
hypothesis). Misuse diagnostics are goldens (tests/golden/errors/rounds_*.cll)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hipress.compll import CllTypeError, SourceFile, algorithms
from hipress.compll.backends.cuda.backend import CudaBackend
from hipress.compll.backends.cuda.emu import CxxToolchain, EmulatedRuntime
from hipress.compll.frontend.check import check_source
from hipress.compll.frontend.parse import parse
from hipress.compll.frontend.rounds import is_rounds, split
from hipress.compll.rounds import load_rounds_source

# round 1 sends each row's sum and the largest |g|; round 2 the gradient centred by the
# summed row means; decode averages it and keeps a counter and the last sum in state
TWO = """algorithm two "centre rows, then average";
state steps: i64;
state last: f32[rows];
payload s { sums: f32[rows]; big: f32; }
payload c { v: f32[n]; }
encode(g) -> s {
    let sums = segreduce(sum, max(cols, 1), n, i => g[i]);
    return concat(map(rows, r => sums[r]), reduce(absmax, g));
}
encode(g, s) -> c {
    return concat(map(n, i => g[i] - s.sums[i / max(cols, 1)] / f32(max(cols, 1) * 4)));
}
decode(g, s, c) {
    steps = steps + 1;
    last = map(rows, r => s.sums[r] + s.big);
    return map(n, i => c.v[i] / f32(world) + f32(steps));
}
"""


def _load(backend: object = "reference"):
    return load_rounds_source(SourceFile("two.cll", TWO), backend)  # type: ignore[arg-type]


def _run(alg, grads: list[torch.Tensor], steps: int = 2) -> torch.Tensor:
    """Every worker's rounds, summed in worker order; returns what the step gives and keeps."""
    states = [alg.init_state(grads[0].shape) for _ in grads]
    out = []
    for _ in range(steps):
        sums: list[torch.Tensor] = []
        for k in range(len(alg.rounds)):
            ps = [
                alg.encode(k, g, s, sums).view(torch.float32)
                for g, s in zip(grads, states, strict=True)
            ]
            sums.append(torch.stack(ps).sum(0))
        res = [alg.decode(g, s, sums, len(grads)) for g, s in zip(grads, states, strict=True)]
        out += [*res, *sums, states[0].tensors["last"], states[0].tensors["steps"].view(1).float()]
    return torch.cat(out)


def test_the_rounds_run_in_order_on_the_reference() -> None:
    alg = _load()
    assert alg.rounds == ("s", "c") and alg.round_nbytes((3, 4)) == [24, 48]
    g = [torch.arange(12.0).reshape(3, 4), torch.ones(3, 4)]
    st0 = alg.init_state((3, 4))
    sums = [alg.encode(0, x, alg.init_state((3, 4))).view(torch.float32) for x in g]
    s = sums[0] + sums[1]
    assert s[:3].tolist() == [10.0, 26.0, 42.0] and s[4].item() == 12.0
    c = alg.encode(1, g[0], st0, [s])
    assert torch.equal(c.view(torch.float32), (g[0] - (s[:3] / 16.0)[:, None]).reshape(-1))
    out = alg.decode(g[0], st0, [s, c.view(torch.float32)], 2)
    assert torch.equal(out, c.view(torch.float32) / 2.0 + 1.0)
    assert st0.step == 1 and st0.tensors["steps"].item() == 1


def test_wrong_sums_are_refused_by_name() -> None:
    alg = _load()
    with pytest.raises(ValueError, match="round 1 takes the sums of the 1 round"):
        alg.encode(1, torch.ones(2, 3), alg.init_state((2, 3)))
    with pytest.raises(ValueError, match=r"round `s`.s sum must be 4 float32 values, got 5"):
        alg.decode(torch.ones(2, 3), alg.init_state((2, 3)), [torch.ones(5), torch.ones(6)], 1)


def test_single_round_entry_points_refuse_it_clearly() -> None:
    src = SourceFile("two.cll", TWO)
    assert is_rounds(parse(src)) and len(split(src, parse(src)).modules) == 3
    assert check_source(src).name == "two"  # every stage checked
    from hipress.compll import load_source

    with pytest.raises(CllTypeError, match="multi-round algorithm: load it with"):
        load_source(src)
    assert "powersgd" not in algorithms()


@pytest.mark.skipif(CxxToolchain.detect() is None, reason="no C++ compiler")
@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.floats(-1e3, 1e3, width=32), min_size=30, max_size=30), st.integers(0, 1))
def test_c_and_emulated_cuda_give_the_reference_bytes(vals: list[float], shape: int) -> None:
    shapes = [(5, 6), (5, 3, 2)]  # one leading dimension: one set of kernels
    g = torch.tensor(vals).reshape(shapes[shape])
    grads = [g, g.flip(0) * 0.5]
    ref = _run(_REF, grads)
    for other in (_C, _EMU):
        assert torch.equal(_run(other, grads).view(torch.int32), ref.view(torch.int32))


_REF = _load()
_C = _load("cpu")
_EMU = _load(lambda p: CudaBackend(p, EmulatedRuntime(blocks=3, shuffle=True, seed=5)))
