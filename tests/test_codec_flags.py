"""Non-finite flags on the host and on the device (hipress/codec/flags.py), the ring thread's
lifetime, and where the Horovod wrapper puts its buffers: what of the GPU path can be checked
without a GPU."""

from __future__ import annotations

import gc
import threading

import pytest
import torch
from dist_utils import run_workers
from torch.utils._python_dispatch import TorchDispatchMode

from hipress.casync import CaSyncState
from hipress.codec.algorithm import init_chunk_states
from hipress.codec.flags import FlagMode
from hipress.compll import load
from hipress.core.plan import Plan, Strategy, TensorPlan
from hipress.horovod.sync import FLAG_BYTES, _with_flag

NAN = float("nan")


class _HostReads(TorchDispatchMode):
    """Records ops that read a value back to the host (a device synchronisation on a GPU)."""

    SYNCING = ("_local_scalar_dense", "nonzero", "is_nonzero", "equal", "item")

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if any(s in func.overloadpacket.__name__ for s in self.SYNCING):
            self.seen.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _chunks() -> list[torch.Tensor]:
    xs = [torch.randn(100, generator=torch.Generator().manual_seed(k)) for k in range(4)]
    xs[1][7] = NAN
    xs[3][0] = -float("inf")
    return xs


def test_device_flags_decide_without_reading_back() -> None:
    dev = FlagMode(device=True)
    alg = load("onebit", backend="reference")
    states = [alg.init_state(100) for _ in range(4)]
    for st in states:
        st.tensors["comp"].fill_(1.0)
    blocks = torch.zeros(3, 16, dtype=torch.uint8)
    with _HostReads() as mode:
        flags = [dev.nonfinite(x) for x in _chunks()]
        flags[0] = dev.from_encode(torch.tensor(False), torch.zeros(3))
        flags[2] = dev.from_encode(None, _chunks()[2])
        dev.write(blocks[:, 8:], flags)
        got = dev.gathered(blocks, 8, 4)
        total = FlagMode.any(got)
        for x, f, st in zip(_chunks(), got, states, strict=True):
            FlagMode.fill_nan(x, f)
            FlagMode.reset(st, f)
    assert mode.seen == []
    assert all(isinstance(f, torch.Tensor) and f.dtype == torch.bool for f in got)
    assert [bool(f) for f in got] == [False, True, False, True] and bool(total)
    assert [bool(st.tensors["comp"].eq(0).all()) for st in states] == [False, True, False, True]


def test_host_and_device_flags_agree() -> None:
    for device in (False, True):
        fm = FlagMode(device)
        xs = _chunks()
        flags = [fm.nonfinite(x) for x in xs]
        row = torch.zeros(2, 4, dtype=torch.uint8)
        fm.write(row, flags)
        assert row.tolist() == [[0, 1, 0, 1]] * 2
        read = fm.read(row[0])
        either = [FlagMode.either(a, b) for a, b in zip(read, [True, False, False, False],
                                                         strict=True)]  # fmt: skip
        assert [bool(f) for f in either] == [True, True, False, True]
        for x, f in zip(xs, read, strict=True):
            FlagMode.fill_nan(x, f)
        assert [bool(x.isnan().all()) for x in xs] == [False, True, False, True]
    assert FlagMode(False).nonfinite(torch.zeros(0)) is False
    assert not bool(FlagMode(True).nonfinite(torch.zeros(0)))


def test_states_live_on_the_parameters_devices() -> None:
    alg = load("topk", backend="reference")
    plan = Plan("topk", {}, 2, (TensorPlan("a", 100, True, Strategy.PS, 2),
                                TensorPlan("b", 50, True, Strategy.ALLGATHER, 1)))  # fmt: skip
    worker, server = init_chunk_states(alg, plan, 0, 2, 0, {"a": torch.device("meta")})
    for key, st in {**worker, **server}.items():
        want = "meta" if key.startswith("a#") else "cpu"
        assert {t.device.type for t in st.tensors.values()} == {want}, key


def test_horovod_rows_are_8_byte_aligned() -> None:
    alg = load("onebit", backend="reference")
    for n in (1, 9, 1000):
        p = alg.encode(torch.randn(n), alg.init_state(n))
        for bad in (False, True, torch.tensor(True)):
            msg = _with_flag(p, bad)
            assert msg.numel() % 8 == 0 and msg.numel() == p.numel() + FLAG_BYTES
            assert torch.equal(msg[: p.numel()], p)
            assert msg[p.numel()].item() == int(bool(bad)) and not msg[p.numel() + 1 :].any()


# ---- the ring thread ends with its state -------------------------------------------------------


def _ring_states(rank: int, world_size: int, count: int) -> tuple[int, int]:
    def ring_threads() -> int:
        return sum(t.name == "hipress-casync-ring" for t in threading.enumerate())

    plan = Plan("onebit", {}, world_size, (TensorPlan("w", 701, True, Strategy.RING, 2),))
    for _ in range(count):
        state = CaSyncState("onebit", named_parameters=[("w", 701)], plan=plan, seed=1)
        state.submit(torch.randn(701), ["w"], last=True).wait()
        running = ring_threads()
        del state
        gc.collect()
    for _ in range(100):  # the last one finishes its queue and exits
        if ring_threads() == 0:
            break
        threading.Event().wait(0.05)
    return running, ring_threads()


def test_the_ring_thread_ends_with_its_state() -> None:
    for running, after in run_workers(_ring_states, 2, 30, timeout=120):
        assert running == 1 and after == 0


def test_a_closed_state_refuses_ring_rounds() -> None:
    pytest.importorskip("torch.distributed")
    from hipress.casync.strategies.ring import RingDriver
    from hipress.codec.errors import CaSyncError

    driver = RingDriver()
    driver.close()
    driver.close()  # idempotent
    with pytest.raises(CaSyncError, match="closed"):
        driver.submit(None, [0], None)  # type: ignore[arg-type]
