"""hipress.diloco's outer sync in real gloo groups: uncompressed it is the mean of the workers'
weight changes and an outer SGD step, bit for bit against plain torch; compressed it is the
reference interpreter's encode/decode math; error feedback keeps the sum."""

from __future__ import annotations

from typing import Any

import diloco_workers as w
import pytest
import torch
from dist_utils import run_workers

from hipress.codec.algorithm import chunk_tensor_id, decode_mean, rank_seed
from hipress.compll import Algorithm, load
from hipress.compll.backends.base import ReferenceBackend

DYADIC = {2: (0.7, 0.9), 4: (0.5, 0.5)}  # world -> (outer lr, momentum)
COMPRESSED = [(2, "onebit", None), (4, "topk", {"ratio": 0.25}), (2, "terngrad", None)]
FEEDBACK = ["onebit", "topk", "signsgd"]


@pytest.fixture(scope="module")
def runs() -> dict[tuple[Any, ...], list[Any]]:
    """Every case of this module, one launch per world size: case -> each rank's result."""
    cases: dict[int, dict[tuple[Any, ...], tuple[Any, ...]]] = {2: {}, 4: {}}
    for world, (lr, mu) in DYADIC.items():
        cases[world][("dyadic", world)] = ("dyadic_rounds", (None, 3, lr, mu))
    for world, name, params in COMPRESSED:
        cases[world][("compressed", name)] = ("trained_rounds", (name, 3), {"params": params})
    for name in FEEDBACK:
        cases[2][("mass", name)] = ("mass", (name, 4))
    out = {}
    for world, mine in cases.items():
        got = run_workers(w.each, world, list(mine.values()), timeout=300)
        out.update({key: [g[i] for g in got] for i, key in enumerate(mine)})
    return out


def _nesterov_reference(start, deltas_per_rank, rounds, lr, mu):  # type: ignore[no-untyped-def]
    """Plain torch: mean of the ranks' deltas, then SGD with Nesterov momentum."""
    world = len(deltas_per_rank)
    anchors = [a.clone() for a in start]
    bufs: list[torch.Tensor | None] = [None] * len(anchors)
    out = []
    for t in range(rounds):
        for i, a in enumerate(anchors):
            g = deltas_per_rank[0][t][i].clone()
            for r in range(1, world):
                g = g + deltas_per_rank[r][t][i]
            g = g / world
            b = bufs[i]
            b = g.clone() if b is None else b.mul(mu).add(g)
            bufs[i] = b
            a.add_(g.add(b, alpha=mu), alpha=-lr)
        out.append([a.clone() for a in anchors])
    return out


@pytest.mark.parametrize("world", sorted(DYADIC))
def test_uncompressed_outer_step_is_the_mean_delta_and_nesterov_bit_for_bit(
    world: int, runs: dict[tuple[Any, ...], list[Any]]
) -> None:
    # two ranks: a + b is the same in any order; four: every value stays on a binary grid
    lr, mu = DYADIC[world]
    got = runs[("dyadic", world)]
    for r in range(1, world):
        for a, b in zip(got[0]["start"], got[r]["start"], strict=True):
            assert torch.equal(a, b)  # every rank starts from rank 0's weights
    ref = _nesterov_reference(got[0]["start"], [g["deltas"] for g in got], 3, lr, mu)
    for r in range(world):
        for t in range(3):
            for mine, want in zip(got[r]["after"][t], ref[t], strict=True):
                assert torch.equal(mine, want), (r, t)


def _reference_means(name: str, got, params=None):  # type: ignore[no-untyped-def]
    """Each sync's mean outer gradients computed with the reference interpreter and states
    seeded as DiLoCo seeds them."""
    alg = load(name, **(params or {}))
    ref = Algorithm(alg.program, ReferenceBackend(alg.program))
    world, names = len(got), got[0]["names"]
    sizes = [g.numel() for g in got[0]["sent"][0]]
    states = [[ref.init_state(n, seed=rank_seed(0, r), tensor_id=chunk_tensor_id(f"diloco:{m}"))
               for m, n in zip(names, sizes, strict=True)] for r in range(world)]  # fmt: skip
    out = []
    for t in range(len(got[0]["sent"])):
        means = []
        for i, n in enumerate(sizes):
            payloads = [ref.encode(got[r]["sent"][t][i], states[r][i]) for r in range(world)]
            mean = torch.empty(n)
            decode_mean(ref, payloads, n, mean)
            means.append(mean)
        out.append(means)
    return out


@pytest.mark.parametrize(("world", "name", "params"), COMPRESSED)
def test_compressed_mean_is_the_reference_interpreters(world: int, name: str, params, runs) -> None:  # type: ignore[no-untyped-def]
    got = runs[("compressed", name)]
    assert len(got) == world
    ref = _reference_means(name, got, params)
    for r in range(world):
        assert len(got[r]["means"]) == 3
        for t in range(3):
            for mine, want in zip(got[r]["means"][t], ref[t], strict=True):
                torch.testing.assert_close(mine, want, rtol=1e-6, atol=1e-7)
    for r in range(1, world):  # the same weights on every rank
        for a, b in zip(got[0]["params"], got[r]["params"], strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("name", FEEDBACK)
def test_error_feedback_keeps_the_sum(name: str, runs: dict[tuple[Any, ...], list[Any]]) -> None:
    got = runs[("mass", name)]
    for i in range(len(got[0]["moved"])):
        sent = (got[0]["sent"][i] + got[1]["sent"][i]) / 2
        owed = (got[0]["owed"][i] + got[1]["owed"][i]) / 2
        moved = got[0]["moved"][i]
        assert owed.abs().sum() > 0  # the codec did drop something
        torch.testing.assert_close(moved + owed, sent, rtol=1e-5, atol=1e-6)
