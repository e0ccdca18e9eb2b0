"""algorithms/powersgd.cll: two rounds (P = M Q summed and orthogonalised, Q = M^T P summed),
warm start, error feedback, the first Q a hash alike on every worker. The reference finds the
best rank-r approximation by power iteration; C and emulated CUDA give its bytes."""

from __future__ import annotations

import pytest
import torch

from hipress.compll.backends.cuda.backend import CudaBackend
from hipress.compll.backends.cuda.emu import CxxToolchain, EmulatedRuntime
from hipress.compll.rounds import load_rounds


def _steps(alg, grads: list[list[torch.Tensor]]) -> torch.Tensor:
    """Workers' steps (grads[w][s]), sums in worker order; the results, sums and state."""
    states = [alg.init_state(grads[0][0].shape) for _ in grads]
    out = []
    for s in range(len(grads[0])):
        sums: list[torch.Tensor] = []
        for k in range(2):
            ps = [
                alg.encode(k, g[s], st, sums).view(torch.float32)
                for g, st in zip(grads, states, strict=True)
            ]
            sums.append(torch.stack(ps).sum(0))
        res = [alg.decode(g[s], st, sums, len(grads)) for g, st in zip(grads, states, strict=True)]
        assert all(torch.equal(r, res[0]) for r in res)  # every worker applies the same
        out += [res[0], *sums, *(st.tensors["residual"] for st in states), states[0].tensors["qs"]]
    return torch.cat(out)


def test_power_iteration_finds_the_best_rank_r_approximation() -> None:
    alg = load_rounds("powersgd", backend="reference", rank=2)
    g = torch.randn(8, 3, 4, generator=torch.Generator().manual_seed(1))
    st = alg.init_state(g.shape)
    for _ in range(10):  # warm start: each step is one more power iteration
        out = alg.step(g, st, lambda x: x, 1).view(8, 12)
        st.tensors["residual"].zero_()
    u, s, v = torch.linalg.svd(g.view(8, 12))
    best = (u[:, :2] * s[:2]) @ v[:2]
    assert (out - best).norm() < 0.02 * best.norm()
    assert alg.round_nbytes(g.shape) == [8 * 2 * 4, 12 * 2 * 4]


def test_error_feedback_keeps_what_was_not_applied() -> None:
    alg = load_rounds("powersgd", backend="reference", rank=1)
    g = torch.randn(6, 5, generator=torch.Generator().manual_seed(2))
    st = alg.init_state(g.shape)
    out = alg.step(g, st, lambda x: x, 1)
    assert torch.allclose(st.tensors["residual"] + out, g.reshape(-1), atol=1e-6)
    assert st.tensors["started"].item() and st.step == 1
    # two workers with the same gradient: the average is the one-worker result
    st2 = [alg.init_state(g.shape) for _ in range(2)]
    sums = [alg.encode(0, g, x).view(torch.float32) * 2 for x in st2[:1]]
    sums.append(alg.encode(1, g, st2[0], sums).view(torch.float32) * 2)
    assert torch.allclose(alg.decode(g, st2[0], sums, 2), out, atol=1e-6)


@pytest.mark.skipif(CxxToolchain.detect() is None, reason="no C++ compiler")
def test_c_and_emulated_cuda_give_the_reference_bytes() -> None:
    gen = torch.Generator().manual_seed(3)
    emu = EmulatedRuntime(blocks=3, shuffle=True, seed=7)
    for shape, rank in (((7, 2, 3), 2), ((4,), 3)):  # rank > cols: zero columns
        grads = [[torch.randn(shape, generator=gen) for _ in range(3)] for _ in range(2)]
        ref = _steps(load_rounds("powersgd", backend="reference", rank=rank), grads)
        backends = ["cpu", lambda p: CudaBackend(p, emu)][: 2 if rank == 2 else 1]
        for be in backends:
            got = _steps(load_rounds("powersgd", backend=be, rank=rank), grads)
            assert torch.equal(got.view(torch.int32), ref.view(torch.int32))


def test_secopa_prices_the_rounds_in_sequence() -> None:
    from hipress.secopa.model.network import link_network
    from hipress.secopa.model.rounds import measure_compute_ms, price_rounds

    alg = load_rounds("powersgd", backend="reference", rank=4)
    net = link_network(125e6, 0.0)  # 1 Gbit/s, no latency
    cost = price_rounds(alg, (8, 32, 32), 4, net, compute_ms=5.0)
    # ring all-reduce of B bytes among 4: 2 * 3 / 4 * B / 125e6 s; P is 8 x 4, Q 1024 x 4
    ms = [2 * 3 / 4 * b / 125e6 * 1e3 for b in (8 * 4 * 4, 1024 * 4 * 4, 8 * 1024 * 4)]
    assert cost.rounds_ms == pytest.approx(tuple(ms[:2]))
    assert cost.total_ms == pytest.approx(ms[0] + ms[1] + 5.0)
    assert cost.plain_ms == pytest.approx(ms[2])
    assert cost.speedup == pytest.approx(ms[2] / (ms[0] + ms[1] + 5.0))
    assert cost.speedup < 1  # a tensor this small: compression does not pay
    assert measure_compute_ms(alg, (8, 6), repeats=1) > 0
