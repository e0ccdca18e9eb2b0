"""CaSync's strategies on real gloo groups of 2 and 4 processes, against the single-process
reference (hipress.casync.reference).

For every algorithm, strategy (allgather, PS, ring), partition count K and bucket dtype, the gradients
each rank gets must equal the reference's bit for bit where compressed (same states, same random
streams, same order of float operations) and up to the allreduce's summation order where not.
One process group per world size runs every case; the tests then check one case each.
"""

from __future__ import annotations

import pytest
import torch
from casync_cases import algorithm_names, make_algorithm, single_thread
from dist_utils import run_workers

from hipress.casync import CaSyncError, CaSyncState
from hipress.casync.reference import ReferenceSync
from hipress.core.plan import Plan, Strategy, TensorPlan

AG, PS, RING, AR = Strategy.ALLGATHER, Strategy.PS, Strategy.RING, Strategy.ALLREDUCE
STEPS = 2  # the second step runs on states the first one advanced
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

# two buckets per step; every (strategy, K) combination, sizes that do not divide evenly,
# uncompressed tensors between compressed ones (so the allreduce needs staging)
# fmt: off
BUCKETS: list[list[tuple[str, int, Strategy, int]]] = [
    [("a", 1000, PS, 3), ("b", 37, AR, 1), ("c", 513, AG, 1), ("g", 5, AR, 1), ("h", 300, AG, 1),
     ("j", 701, RING, 2), ("k", 129, RING, 1)],
    [("d", 2001, AG, 3), ("e", 64, PS, 1), ("f", 10, AR, 1), ("i", 999, PS, 3),
     ("l", 1502, RING, 3)],
]
# fmt: on
TENSORS = [t for b in BUCKETS for t in b]


def _plan(alg_name: str, world_size: int) -> Plan:
    entries = tuple(
        TensorPlan(name, n, strategy is not AR, strategy, k) for name, n, strategy, k in TENSORS
    )
    return Plan(make_algorithm(alg_name).name, {}, world_size, entries)


def _grads(rank: int, step: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    out = {}
    for i, (name, n, _, _) in enumerate(TENSORS):
        scale = 10.0 ** (i % 3 - 1)
        out[name] = (torch.randn(n, generator=gen) * scale).to(dtype)
    return out


def _cases() -> list[tuple[str, str]]:
    return [(a, "float32") for a in algorithm_names()] + [
        ("terngrad", "float16"),
        ("onebit", "bfloat16"),
        ("dgc", "float16"),
    ]


def _run_cases(rank: int, world_size: int, cases: list[tuple[str, str]]) -> dict:
    results = {}
    for alg_name, dtype_name in cases:
        dtype = DTYPES[dtype_name]
        state = CaSyncState(
            make_algorithm(alg_name),
            named_parameters=[(name, n) for name, n, _, _ in TENSORS],
            plan=_plan(alg_name, world_size),
            seed=7,
        )
        steps = []
        for step in range(STEPS):
            grads = _grads(rank, step, dtype)
            buffers = [torch.cat([grads[t[0]] for t in b]) for b in BUCKETS]
            futures = [
                state.submit(buf, [t[0] for t in b], last=i == len(BUCKETS) - 1)
                for i, (buf, b) in enumerate(zip(buffers, BUCKETS, strict=True))
            ]
            out = {}
            for fut, b in zip(futures, BUCKETS, strict=True):
                flat = fut.wait()
                assert flat.dtype == dtype
                for part, (name, *_) in zip(flat.split([t[1] for t in b]), b, strict=True):
                    out[name] = part.clone()
            steps.append(out)
        results[(alg_name, dtype_name)] = {"steps": steps, "stats": state.stats.last}
    return results


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"N{n}")
def synced(request: pytest.FixtureRequest) -> tuple[int, list[dict]]:
    n = request.param
    return n, run_workers(_run_cases, n, _cases(), timeout=180)


@pytest.mark.parametrize("case", _cases(), ids=lambda c: f"{c[0]}-{c[1]}")
def test_matches_reference(synced: tuple[int, list[dict]], case: tuple[str, str]) -> None:
    world_size, results = synced
    alg_name, dtype_name = case
    dtype = DTYPES[dtype_name]
    ref = ReferenceSync(make_algorithm(alg_name), _plan(alg_name, world_size), world_size, seed=7)
    for step in range(STEPS):
        with single_thread():
            expected = ref.step([_grads(r, step, dtype) for r in range(world_size)])
        for rank in range(world_size):
            got = results[rank][case]["steps"][step]
            for name, _, strategy, k in TENSORS:
                where = f"rank {rank} step {step} tensor {name} ({strategy.value}, K={k})"
                assert got[name].dtype == dtype, where
                if strategy is AR:
                    # gloo's allreduce may sum in another order: allow N roundings
                    tol = world_size * torch.finfo(dtype).eps
                    torch.testing.assert_close(
                        got[name],
                        expected[name],
                        rtol=tol,
                        atol=tol * float(expected[name].abs().max()),
                        msg=lambda m, where=where: f"{where}: {m}",
                    )
                else:
                    assert torch.equal(got[name], expected[name]), where
        # every rank ends with identical gradients
        for rank in range(1, world_size):
            for name in got:
                assert torch.equal(
                    results[rank][case]["steps"][step][name], results[0][case]["steps"][step][name]
                )


def test_bulk_collectives_and_bytes(synced: tuple[int, list[dict]]) -> None:
    """Many tensors share a collective: the count per step is fixed by the rounds, not the
    number of tensors; compressed blocks are smaller than the gradients."""
    n, results = synced
    case = _cases()[0]
    stats = results[0][case]["stats"]
    # bucket 1: allreduce + AG round {c, h} + PS rounds {a0}, {a1}, {a2} (2 collectives each)
    #   + ring rounds {j0, k}, {j1} (2(N-1) messages each)
    # bucket 2: allreduce + AG rounds {d0}, {d1}, {d2} + PS rounds {e, i0}, {i1}, {i2}
    #   + ring rounds {l0}, {l1}, {l2}
    ring = 2 * (n - 1)
    assert stats.collectives == (1 + 1 + 3 * 2 + 2 * ring) + (1 + 3 + 3 * 2 + 3 * ring)
    assert stats.buckets == 2
    assert stats.bytes_uncompressed == sum(n for _, n, _, _ in TENSORS) * 4
    assert stats.bytes_sent > 0
    assert stats.encode_ms > 0 and stats.decode_ms > 0 and stats.sync_ms > 0


def _resubmit(rank: int, world_size: int) -> str:
    state = CaSyncState(
        make_algorithm("onebit"),
        named_parameters=[("a", 1000)],
        plan=Plan("onebit", {}, world_size, (TensorPlan("a", 1000, True, PS, 1),)),
    )
    # a PS bucket that is not the last stays in flight until the next submit
    first = state.submit(torch.randn(1000), ["a"], last=False)
    with pytest.raises(CaSyncError) as info:
        state.submit(torch.randn(1000), ["a"], last=True)
    # the earlier bucket of the step fails too rather than leaving its future pending
    with pytest.raises(CaSyncError):
        first.wait()
    return str(info.value)


def test_a_layout_in_flight_cannot_be_submitted_again() -> None:
    for msg in run_workers(_resubmit, 2):
        assert "submitted again before its previous synchronisation completed" in msg


# ---- pipelining ------------------------------------------------------------------

PIPE = [("p", 30_000, PS, 3), ("q", 20_000, AG, 3), ("r", 100, AR, 1), ("s", 50, AR, 1)]
FIRST, SECOND = ["p", "q", "r"], ["s"]  # two buckets: the step's last one issues PS phase 2


def _pipe_state(world_size: int, alg_name: str = "terngrad") -> CaSyncState:
    return CaSyncState(
        make_algorithm(alg_name),
        named_parameters=[(n, k) for n, k, _, _ in PIPE],
        plan=Plan(
            make_algorithm(alg_name).name,
            {},
            world_size,
            tuple(TensorPlan(n, k, s is not AR, s, p) for n, k, s, p in PIPE),
        ),
        log_every=0,
    )


def _pipelined(rank: int, world_size: int, delay: float) -> tuple[float, bool, float, int]:
    import time

    state = _pipe_state(world_size)
    first, second = torch.randn(30_000 + 20_000 + 100), torch.randn(50)

    def step() -> tuple[float, bool, float]:
        t = time.perf_counter()
        fut = state.submit(first.clone(), FIRST, last=False)
        issued = time.perf_counter() - t
        pending = not fut.done()
        state.submit(second.clone(), SECOND, last=True).wait()
        fut.wait()
        return issued, pending, time.perf_counter() - t

    step()  # allocates the layouts
    if rank == 1:
        time.sleep(delay)  # the peer is late: nothing can arrive before it submits
    return (*step(), state.stats.steps[-1].collectives)


def test_partitions_are_encoded_and_issued_without_waiting_for_the_wire() -> None:
    """Rank 0 encodes and issues all K partitions of both strategies while partition 0 is
    still on the wire (rank 1 has not even submitted), and returns; the results arrive later."""
    delay = 2.0
    issued, pending, total, collectives = run_workers(_pipelined, 2, delay)[0]
    # bucket 1: allreduce, 3 allgather rounds, 3 PS rounds of 2; bucket 2: allreduce
    assert collectives == 1 + 3 + 3 * 2 + 1
    assert pending and issued < delay / 2 < total, (issued, total)


# ---- the NaN/Inf check: from the encode where it can, never a read of the whole bucket --------


def _checks(rank: int, world_size: int, alg_name: str) -> list[int]:
    from torch.utils._python_dispatch import TorchDispatchMode

    sizes: list[int] = []

    class Reads(TorchDispatchMode):  # the NaN/Inf check reads a tensor with aminmax
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if func.overloadpacket.__name__ == "aminmax":
                sizes.append(args[0].numel())
            return func(*args, **(kwargs or {}))

    tensors = [("p", 1000, PS, 2), ("q", 37, AR, 1), ("r", 513, AG, 1)]
    plan = Plan(alg_name, {}, world_size, tuple(
        TensorPlan(name, n, s is not AR, s, k) for name, n, s, k in tensors))  # fmt: skip
    state = CaSyncState(make_algorithm(alg_name), named_parameters=[(n, k) for n, k, *_ in tensors],
                        plan=plan, seed=1)  # fmt: skip
    buf = torch.randn(1550, generator=torch.Generator().manual_seed(rank))
    with Reads():
        state.submit(buf, [t[0] for t in tensors], last=True).wait()
    return sizes


@pytest.mark.parametrize("alg_name", ["onebit", "int8"])
def test_allgather_and_ps_check_their_chunks_not_the_bucket(alg_name: str) -> None:
    """onebit's encode reports NaN/Inf from its own pass: nothing else reads the gradient;
    int8's does not (its first pass is a segment reduction), so each piece it encodes (the PS
    partitions' shards of 250, the allgather's 513) is read once, never the whole bucket of
    1550 elements."""
    for sizes in run_workers(_checks, 2, alg_name, timeout=60):
        assert sorted(sizes) == ([] if alg_name == "onebit" else [250] * 4 + [513]), sizes
