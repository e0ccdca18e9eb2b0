"""algorithms/acpsgd.cll: one round per step, alternating P = M Q and Q = M^T P, the kept factor
orthogonalised, warm start, error feedback. The reference finds the best rank-r approximation
by the alternating power iteration; C and emulated CUDA give its bytes."""

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
        ps = [
            alg.encode(0, g[s], st, []).view(torch.float32)
            for g, st in zip(grads, states, strict=True)
        ]
        sums = [torch.stack(ps).sum(0)]
        res = [alg.decode(g[s], st, sums, len(grads)) for g, st in zip(grads, states, strict=True)]
        assert all(torch.equal(r, res[0]) for r in res)  # every worker applies the same
        t = states[0].tensors
        out += [res[0], *sums, *(st.tensors["residual"] for st in states), t["qs"], t["ps"]]
    return torch.cat(out)


def test_alternating_power_iteration_finds_the_best_rank_r_approximation() -> None:
    alg = load_rounds("acpsgd", backend="reference", rank=2)
    g = torch.randn(8, 3, 4, generator=torch.Generator().manual_seed(1))
    st = alg.init_state(g.shape)
    assert alg.round_nbytes(g.shape) == [12 * 2 * 4]  # one round: the larger factor, Q here
    for s in range(12):  # warm start: each step is half a power iteration
        assert st.tensors["qstep"].item() == (s % 2 == 1)  # P, Q, P, Q, ...
        out = alg.step(g, st, lambda x: x, 1).view(8, 12)
        st.tensors["residual"].zero_()
    u, sv, v = torch.linalg.svd(g.view(8, 12))
    best = (u[:, :2] * sv[:2]) @ v[:2]
    assert (out - best).norm() < 0.02 * best.norm()


def test_error_feedback_keeps_what_was_not_applied() -> None:
    alg = load_rounds("acpsgd", backend="reference", rank=1)
    g = torch.randn(6, 5, generator=torch.Generator().manual_seed(2))
    st = alg.init_state(g.shape)
    for _ in range(2):  # a P step, then a Q step
        before = st.tensors["residual"].clone()
        out = alg.step(g, st, lambda x: x, 1)
        assert torch.allclose(st.tensors["residual"] + out, g.reshape(-1) + before, atol=1e-5)
    # two workers with the same gradient: the average is the one-worker result
    st1, st2 = alg.init_state(g.shape), alg.init_state(g.shape)
    one = alg.step(g, st1, lambda x: x, 1)
    two = alg.step(g, st2, lambda x: x * 2, 2)
    assert torch.allclose(one, two, atol=1e-6)


@pytest.mark.skipif(CxxToolchain.detect() is None, reason="no C++ compiler")
def test_c_and_emulated_cuda_give_the_reference_bytes() -> None:
    gen = torch.Generator().manual_seed(3)
    emu = EmulatedRuntime(blocks=3, shuffle=True, seed=7)
    shape, rank = (3, 5, 2), 4  # rank > rows: P's last column orthogonalises to zero
    grads = [[torch.randn(shape, generator=gen) for _ in range(3)] for _ in range(2)]
    ref = _steps(load_rounds("acpsgd", backend="reference", rank=rank), grads)
    for be in ("cpu", lambda p: CudaBackend(p, emu)):
        got = _steps(load_rounds("acpsgd", backend=be, rank=rank), grads)
        assert torch.equal(got.view(torch.int32), ref.view(torch.int32))
