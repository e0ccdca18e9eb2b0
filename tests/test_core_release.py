"""hipress.core.release: a waited-for collective leaves its tensors to Python alone, so that no
gloo worker thread needs the GIL after the script's last collective."""

from __future__ import annotations

import functools
import time

import pytest
import torch
import torch.distributed as dist
from dist_utils import run_workers

from hipress.core.release import InFlight


def _gathers(rank: int, world_size: int, rounds: int) -> list[tuple[list[int], list[int], bool]]:
    out = []
    for r in range(rounds):
        mine = torch.full((1 << 12,), float(rank + r))
        got = torch.empty(world_size * mine.numel())
        view = got[:8]  # a view holds a reference of its own: the count to return to
        flight = InFlight(functools.partial(dist.all_gather_into_tensor, got, mine,
                                            async_op=True), [got, mine])  # fmt: skip
        flight.wait()
        flight.wait()  # a second wait does nothing
        right = all(
            bool((got[i * mine.numel() : (i + 1) * mine.numel()] == float(i + r)).all())
            for i in range(world_size)
        )
        out.append((flight.counts, [got._use_count(), mine._use_count()], right))
        del view
    return out


@pytest.mark.parametrize("world_size", [2, 4])
def test_after_wait_the_backend_holds_none_of_the_tensors(world_size: int) -> None:
    for per_rank in run_workers(_gathers, world_size, 20):
        for before, after, right in per_rank:
            assert right
            assert after == before, (before, after)


def _guarded(rank: int, world_size: int) -> str:
    x = torch.ones(4)
    flight = InFlight(lambda: dist.all_reduce(x, async_op=True), [x])

    def guard(fn):  # type: ignore[no-untyped-def]
        fn()
        raise ValueError(f"guard saw the wait on rank {rank}")

    try:
        flight.wait(guard)
    except ValueError as exc:
        return str(exc)
    return "no error"


def test_the_guard_wraps_the_wait_and_its_error_propagates() -> None:
    assert run_workers(_guarded, 2) == [f"guard saw the wait on rank {r}" for r in range(2)]


def test_a_tensor_held_elsewhere_ends_the_wait_at_its_timeout() -> None:
    x = torch.ones(4)

    class Done:
        def wait(self) -> None:
            pass

    flight = InFlight(Done, [x])
    kept = x[:2]  # taken after the counts: never goes back
    began = time.monotonic()
    flight.wait(timeout_s=0.05)
    assert time.monotonic() - began < 30  # returned, not hung
    assert flight.work is None and kept.numel() == 2


def test_only_cpu_tensors_are_waited_for() -> None:
    on_cpu, elsewhere = torch.ones(4), torch.empty(4, device="meta")

    class Done:
        def wait(self) -> None:
            pass

    flight = InFlight(Done, [on_cpu, elsewhere])
    assert flight.tensors == (on_cpu,)


def test_the_exit_pause_is_armed_only_by_its_users() -> None:
    import subprocess
    import sys

    code = ("import hipress.casync, hipress.fsdp, hipress.diloco\n"
            "from hipress.core import release\n"
            "print(release._IN_USE.is_set())\n"
            "release.settle_at_exit()\n"
            "print(release._IN_USE.is_set())\n")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()  # fmt: skip
    assert out == ["False", "True"]
