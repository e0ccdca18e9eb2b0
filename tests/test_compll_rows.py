"""Exact row-sparse synchronisation written in CompLL (tests/golden/programs/rows.cll), a
multi-round algorithm: the union of the touched rows, then their values, both summed. Within
its bound it gives the dense mean bit for bit on the reference interpreter and the C kernels
(repeated rows across workers, rows holding only -0.0, steps touching no row); past the bound
it decodes NaN everywhere, on every worker (the language cannot fall back to a dense sum);
and the rounds cost what the file says (4 bytes per row, then the bound's rows)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hipress.compll.rounds import RoundsAlgorithm, load_rounds_file

ROWS = Path(__file__).parent / "golden" / "programs" / "rows.cll"
_LOADED: dict[tuple[str, int], RoundsAlgorithm] = {}


def rows_alg(backend: str, bound: int) -> RoundsAlgorithm:
    key = (backend, bound)
    if key not in _LOADED:
        _LOADED[key] = load_rounds_file(ROWS, backend=backend, bound=bound)
    return _LOADED[key]


def step(alg: RoundsAlgorithm, grads: list[torch.Tensor]) -> tuple[list[torch.Tensor], list]:
    """One step on ``len(grads)`` workers, the all-reduce a sum in rank order: each worker's
    result and each round's payloads."""
    world = len(grads)
    states = [alg.init_state(g.shape) for g in grads]
    sums: list[torch.Tensor] = []
    sent = []
    for k in range(len(alg.rounds)):
        pays = [alg.encode(k, g, s, sums, world) for g, s in zip(grads, states, strict=True)]
        sent.append([bytes(p.tolist()) for p in pays])
        total = pays[0].view(torch.float32).clone()
        for p in pays[1:]:
            total += p.view(torch.float32)
        sums.append(total)
    outs = [alg.decode(g, s, sums, world) for g, s in zip(grads, states, strict=True)]
    return outs, sent


def grads(world: int, rows: int, width: int, touched: int, seed: int) -> list[torch.Tensor]:
    """Each worker's gradient: ``touched`` random rows of multiples of 1/64 (so any summation
    order is exact), row 0 on every worker, and a row holding only -0.0 on worker 0."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(world):
        g = torch.zeros(rows, width)
        idx = torch.randperm(rows, generator=gen)[:touched]
        g[idx] = torch.randint(-64, 64, (idx.numel(), width), generator=gen).float() / 64
        g[0] = 1.0 / 64
        out.append(g)
    out[0][rows - 1] = 0.0
    out[0][rows - 1, width - 1] = -0.0
    return out


@pytest.mark.parametrize(("world", "rows", "width"), [(2, 40, 12), (4, 40, 7), (2, 40, 1)])
def test_within_the_bound_equals_the_dense_mean(world: int, rows: int, width: int) -> None:
    gs = grads(world, rows, width, touched=3, seed=rows)
    want = (torch.stack(gs).sum(0) / world).view(-1)
    union = sum((g.view(torch.int32) != 0).any(1) for g in gs)
    assert int((union > 0).sum()) <= 16  # within the bound
    results = {}
    for backend in ("reference", "cpu"):
        outs, sent = step(rows_alg(backend, 16), gs)
        for out in outs:
            assert torch.equal(out, want), backend
        results[backend] = sent
    assert results["reference"] == results["cpu"]  # every round's bytes


def test_no_touched_row_gives_zeros() -> None:
    gs = [torch.zeros(40, 4), torch.zeros(40, 4)]
    for backend in ("reference", "cpu"):
        outs, _ = step(rows_alg(backend, 16), gs)
        assert all(torch.equal(o, torch.zeros(160)) for o in outs), backend


def test_past_the_bound_every_worker_decodes_nan() -> None:
    gs = grads(2, 40, 12, touched=12, seed=5)  # each worker alone is within 16; the union not
    assert all(int((g != 0).any(1).sum()) <= 16 for g in gs)
    assert int(sum((g != 0).any(1) for g in gs).gt(0).sum()) > 16
    for backend in ("reference", "cpu"):
        outs, _ = step(rows_alg(backend, 16), gs)
        assert all(bool(o.isnan().all()) for o in outs), backend


def test_round_sizes() -> None:
    alg = rows_alg("reference", 16)
    assert alg.round_nbytes((40, 12)) == [40 * 4, 16 * 12 * 4]  # a flag per row, 16 rows
    assert alg.round_nbytes((8, 12)) == [8 * 4, 8 * 12 * 4]  # a bound above the rows: all
