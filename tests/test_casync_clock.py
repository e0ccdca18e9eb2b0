"""Stream-ordered timing (hipress.casync.clock) in the stats and the trace.

The GPU's path runs here on the host with :class:`HostEvents` (events completed by the host
when the work is done) and with events the tests complete themselves; the tests marked cuda
check on a GPU that the figures and spans hold the device's work, not the host's launching."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from dist_utils import run_workers

from hipress.casync.clock import (
    Clock,
    EventClock,
    EventMark,
    HostEvent,
    HostEvents,
    Lap,
    clock_for,
)
from hipress.casync.stats import SyncStats
from hipress.casync.trace import DEVICE_LANE, NETWORK_LANE, Tracer

# ---- the clocks ---------------------------------------------------------------------------------


class _Manual:
    """An event source whose events the test completes, at times it chooses."""

    def __init__(self) -> None:
        self.made: list[HostEvent] = []

    def now(self) -> HostEvent:
        self.made.append(HostEvent())
        return self.made[-1]

    anchor = now

    def after(self, works: Any) -> HostEvent:
        return self.now()


def test_the_host_clock_reads_the_wall_clock_at_once() -> None:
    clock = clock_for("cpu")
    assert type(clock) is Clock and clock.on_host and type(clock_for(None)) is Clock
    start = clock.mark()
    end = clock.mark()
    lap = Lap(start, end)
    assert lap.known and lap.ready() and clock.after([object()]) is None
    assert lap.seconds == end.t - start.t >= 0 and lap.bounds() == (start.t, end.t)


def test_an_event_lap_is_read_once_its_events_complete_and_placed_by_the_anchor() -> None:
    events = _Manual()
    clock = EventClock(events)
    clock.begin_step()
    anchor_ev = events.made[0]
    start, end = clock.mark(), clock.mark()
    assert isinstance(start, EventMark) and start.anchor.event is anchor_ev
    lap = Lap(start, end)
    assert not lap.known and not lap.ready() and not lap.wait(timeout=0.01)
    with pytest.raises(RuntimeError, match="must be completed"):
        lap.seconds  # noqa: B018
    anchor_ev.complete(100.0)  # the device times of the anchor and the two marks
    events.made[1].complete(100.5)
    events.made[2].complete(100.75)
    assert lap.ready() and lap.wait(timeout=0)
    assert lap.seconds == pytest.approx(0.25)
    a = start.anchor.host  # the host time the anchor was recorded at
    assert lap.bounds() == pytest.approx((a + 0.5, a + 0.75))

    # an anchor that completed late (its stream was busy) would put an event before the host
    # recorded it: the host time is the floor
    clock.begin_step()
    late = clock.mark()
    events.made[3].complete(200.0)
    events.made[4].complete(199.0)
    assert Lap(late, late).bounds() == (late.host, late.host)


def test_host_events_behave_like_cuda_events() -> None:
    a, b = HostEvent(), HostEvent()
    assert not a.query()
    with pytest.raises(RuntimeError, match="must be completed"):
        a.elapsed_time(b)
    a.complete(1.0)
    threading.Timer(0.05, b.complete, args=(1.5,)).start()
    b.synchronize()
    assert b.query() and a.elapsed_time(b) == pytest.approx(500.0)
    events = HostEvents()
    assert events.now().query() and events.anchor().query() and events.after([]).query()


def _collective_events(rank: int, world: int) -> tuple[bool, bool, float, bool]:
    events = HostEvents()
    x = torch.ones(1 << 16)
    if rank == 1:
        time.sleep(0.2)  # rank 0's allreduce completes only once rank 1 issues its own
    work = dist.all_reduce(x, async_op=True)
    issued = events.now()
    done = events.after([work])
    assert done is not None
    at_issue = done.query()
    work.wait()
    while not done.query():  # (completed on the backend's thread, after wait() may return)
        time.sleep(0.001)
    t, r = torch.ones(4), torch.empty(4)
    p2p = dist.batch_isend_irecv([dist.P2POp(dist.isend, t, group_peer=1 - rank),
                                  dist.P2POp(dist.irecv, r, group_peer=1 - rank)])  # fmt: skip
    no_future = events.after(p2p) is None  # gloo's point-to-point works have no future
    for w in p2p:
        w.wait()
    return at_issue, done.query(), issued.elapsed_time(done), no_future


def test_host_events_complete_with_the_collective() -> None:
    (at_issue, done, ms, no_future), _ = run_workers(_collective_events, 2)
    assert not at_issue and done and no_future
    assert ms >= 150  # the allreduce took until rank 1 issued it


# ---- the stats ----------------------------------------------------------------------------------


def _manual_stats() -> tuple[SyncStats, _Manual]:
    events = _Manual()
    clock = EventClock(events)
    return SyncStats(log_every=1, clocks=lambda device: clock), events


def test_a_stream_ordered_step_closes_unread_and_is_read_once_its_events_complete(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stats, events = _manual_stats()
    stats.bucket_submitted(last=True)  # anchor [0], step start [1]
    stats.add(bytes_sent=10, collectives=1)
    with stats.timed("encode_ms"):  # [2], [3]
        pass
    clock = stats.clock
    stats.add_lap("comm_ms", Lap(clock.mark(), clock.after([])))  # [4], [5]
    stats.bucket_finished()  # the bucket's completion [6]
    assert stats.unread == 1 and not stats._steps  # closed, waiting for the device
    stats.bucket_submitted(last=True)  # the next step does not wait for it: anchor [7]...
    assert stats.unread == 1
    times = [0.0, 1.0, 1.002, 1.005, 1.005, 1.015, 1.030]
    for event, t in zip(events.made, times, strict=False):
        event.complete(t)
    with caplog.at_level(logging.INFO, logger="hipress.casync.stats"):
        assert stats.unread == 0  # read without waiting now, and logged then
    assert "casync step 0: sent" in caplog.text
    first = stats._steps[0]
    assert first.step == 0 and first.bytes_sent == 10 and first.collectives == 1
    assert first.encode_ms == pytest.approx(3.0) and first.comm_ms == pytest.approx(10.0)
    assert first.sync_ms == pytest.approx(30.0)

    # reading the figures waits for the device (here: another thread completes the events)
    stats.bucket_finished()
    threading.Timer(0.05, lambda: [e.complete() for e in events.made[7:]]).start()
    assert stats.last is not None and stats.last.step == 1 and stats.unread == 0


def test_a_step_the_device_never_finishes_is_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    import hipress.casync.stats as module

    monkeypatch.setattr(module, "_WAIT_S", 0.05)
    stats, _ = _manual_stats()
    stats.bucket_submitted(last=True)
    stats.bucket_finished()
    assert len(stats.steps) == 0 and stats.unread == 0


def test_codec_lock_waits_come_out_of_host_figures_only() -> None:
    from hipress.casync.strategies.context import SyncContext
    from hipress.core.compression import Uncompressed

    def encode_ms(stats: SyncStats) -> tuple[float, float]:
        ctx = SyncContext(0, 1, Uncompressed(), {}, {}, stats)
        stats.bucket_submitted(last=True)
        ctx.codec_lock.acquire()
        threading.Timer(0.05, ctx.codec_lock.release).start()
        with ctx.codec("encode_ms"):
            pass
        stats.bucket_finished()
        last = stats.last
        assert last is not None
        return last.encode_ms, last.codec_wait_ms

    host, wait = encode_ms(SyncStats(log_every=0))
    assert wait >= 40 and host == pytest.approx(-wait)  # the caller's span adds it back
    events = EventClock(HostEvents())
    device, wait = encode_ms(SyncStats(log_every=0, clocks=lambda d: events))
    assert wait >= 40 and device == 0.0


def test_stats_pickle_after_reading_their_steps() -> None:
    import pickle

    stats = SyncStats(log_every=0, clocks=_host_events_clock)
    stats.bucket_submitted(last=True)
    with stats.timed("decode_ms"):
        pass
    stats.bucket_finished()
    clone = pickle.loads(pickle.dumps(stats))
    assert clone.last == stats.last and clone.unread == 0


def _host_events_clock(device: torch.device | None) -> Clock:
    return EventClock(HostEvents())


# ---- the trace ----------------------------------------------------------------------------------


def test_a_trace_is_written_once_its_device_spans_are_read(tmp_path: Path) -> None:
    tracer = Tracer(rank=0)
    events = _Manual()
    clock = EventClock(events)
    tracer.record(tmp_path / "t.json", steps=1)
    clock.begin_step()
    tracer.step_opened()
    lap = Lap(clock.mark(), clock.mark())
    tracer.lap("encode", "encode", lap, lane=DEVICE_LANE)
    tracer.lap("allgather", "comm", lap, lane=NETWORK_LANE, bytes=8)
    tracer.step_done()
    tracer.step_opened()  # the recorded step is over, its device spans are not read yet
    assert tracer.written is None and not tracer.recording
    for event, t in zip(events.made, (5.0, 5.25, 5.5), strict=True):
        event.complete(t)
    tracer.step_opened()  # (nothing recorded from this step on)
    assert tracer.written == tmp_path / "t-rank0.json"
    spans = {e["name"]: e for e in tracer.events()}
    assert spans["encode"]["dur"] == pytest.approx(250_000.0)
    assert spans["encode"]["tid"] == DEVICE_LANE and spans["allgather"]["tid"] == NETWORK_LANE
    anchor = lap.start.anchor.host  # type: ignore[union-attr]
    assert spans["encode"]["ts"] == pytest.approx((anchor + 0.25 + tracer._offset) * 1e6)
    assert spans["allgather"]["args"] == {"bytes": 8}


def test_stop_waits_for_the_device_spans_and_overlaps_get_lanes_of_their_own() -> None:
    tracer = Tracer()
    clock = EventClock(_Manual())
    tracer.record(None, steps=None)
    first = Lap(clock.mark(), clock.mark())
    second = Lap(clock.mark(), clock.mark())
    tracer.lap("encode", "encode", first, lane=DEVICE_LANE)
    tracer.lap("decode", "decode", second, lane=DEVICE_LANE)
    times = (0.0, 0.0, 1.0, 0.5, 2.0)  # anchor, then two overlapping laps
    made = clock.events.made  # type: ignore[attr-defined]
    threading.Timer(0.05, lambda: [e.complete(t) for e, t in zip(made, times, strict=True)]).start()
    tracer.stop()
    doc = tracer.to_json()
    lanes = {e["name"]: e["tid"] for e in doc["traceEvents"] if e.get("ph") == "X"}
    assert lanes == {"encode": DEVICE_LANE, "decode": f"{DEVICE_LANE} 2"}
    named = {e["tid"] for e in doc["traceEvents"] if e.get("name") == "thread_name"}
    assert {DEVICE_LANE, f"{DEVICE_LANE} 2", NETWORK_LANE} <= named


# ---- a DDP run on the stream-ordered path, on gloo ----------------------------------------------


def _ddp_run(rank: int, world: int, out: str, stand_in: bool) -> dict[str, Any]:
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from hipress.casync import register
    from hipress.core.plan import Plan, Strategy, TensorPlan

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 96), nn.ReLU(),
                          nn.Linear(96, 8))  # fmt: skip
    layout = {"0.weight": Strategy.RING, "2.weight": Strategy.ALLGATHER, "4.weight": Strategy.PS}
    entries = tuple(
        TensorPlan(n, p.numel(), n in layout, layout.get(n, Strategy.ALLREDUCE), 1)
        for n, p in model.named_parameters()
    )
    ddp = DDP(model, bucket_cap_mb=0.02)
    state = register(ddp, "onebit", plan=Plan("onebit", {}, world, entries), log_every=0,
                     warmup_steps=1)  # fmt: skip
    if stand_in:
        state.stats.clocks = _host_events_clock
    x, y = torch.randn(16, 32), torch.randn(16, 8)
    for step in range(4):
        if step == 1:
            state.trace(Path(out) / "run-{rank}.json", steps=2)
        with state.tracer.span("step", "step"), state.tracer.span("backward", "compute"):
            nn.functional.mse_loss(ddp(x), y).backward()
    steps = [s.as_dict() for s in state.stats.steps]
    return {"steps": steps, "clock": state.stats.clock.on_host}


def test_a_ddp_run_on_the_stream_ordered_path(tmp_path: Path) -> None:
    from hipress.timeline import breakdown, load_traces

    host = run_workers(_ddp_run, 2, str(tmp_path / "host"), False)
    events = run_workers(_ddp_run, 2, str(tmp_path / "events"), True)
    for h, e in zip(host, events, strict=True):
        assert h["clock"] and not e["clock"]
        assert len(e["steps"]) == 4
        for hs, es in zip(h["steps"], e["steps"], strict=True):  # the same counts
            for k in ("buckets", "collectives", "bytes_sent", "bytes_uncompressed"):
                assert hs[k] == es[k], k
        for s in e["steps"][1:]:  # compressed steps: every figure was read
            assert s["encode_ms"] > 0 and s["decode_ms"] > 0 and s["comm_ms"] > 0
            assert s["sync_ms"] > 0
    spans = load_traces(sorted((tmp_path / "events").glob("run-*.json")))
    on_device = {(e["name"], e["cat"]) for e in spans if e["lane"].startswith(DEVICE_LANE)}
    assert {("encode", "encode"), ("decode", "decode")} <= on_device
    launched = {e["cat"] for e in spans if e["lane"] == "main" and e["name"] == "encode"}
    assert launched == {"issue"}  # on the main thread, the encode only launches
    comm = {e["name"] for e in spans if e["cat"] == "comm"}
    assert {"allgather", "PS all_to_all", "PS all-gather", "ring hop", "allreduce"} <= comm
    for row in breakdown(spans)["ranks"].values():
        assert row["steps"] == 2 and row["encode"] == 0 and row["encode_all"] > 0
        assert row["decode_all"] > 0 and row["network"] > 0


# ---- on a GPU -----------------------------------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")


class _Slow:
    """No compression, but each encode and decode first keeps the stream busy for ``cycles``
    GPU cycles (a kernel the host launches in microseconds)."""

    def __init__(self, cycles: int) -> None:
        from hipress.core.compression import Uncompressed

        self._alg = Uncompressed()
        self.name, self.params, self.digest = "slow", {}, "slow"
        self.cycles = cycles

    def payload_nbytes(self, n: int) -> int:
        return self._alg.payload_nbytes(n)

    def init_state(self, n: int, device: Any = None, seed: int = 0, tensor_id: int = 0) -> Any:
        return self._alg.init_state(n, device, seed, tensor_id)

    def encode(self, grad: torch.Tensor, state: Any, out: Any = None) -> torch.Tensor:
        torch.cuda._sleep(self.cycles)
        return self._alg.encode(grad, state, out)

    def decode(self, payload: torch.Tensor, n: int, out: Any = None, accumulate: bool = False
               ) -> torch.Tensor:  # fmt: skip
        torch.cuda._sleep(self.cycles)
        return self._alg.decode(payload, n, out, accumulate)


def _gpu(rank: int, world: int) -> dict[str, Any]:
    from hipress.casync import CaSyncState
    from hipress.core.plan import Plan, Strategy, TensorPlan

    dev = torch.device("cuda", torch.cuda.current_device())
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    cycles = int(10_000_000 * 100.0 / start.elapsed_time(end))  # about 100 ms
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    out: dict[str, Any] = {"sleep_ms": start.elapsed_time(end)}

    n = 1 << 20
    names = ["a", "b"]
    plan = Plan("slow", {}, 1, (TensorPlan("a", n, True, Strategy.ALLGATHER, 1),
                                TensorPlan("b", n, False, Strategy.ALLREDUCE, 1)))  # fmt: skip
    slow = CaSyncState(_Slow(cycles), named_parameters=[("a", n), ("b", n)], plan=plan,
                       device=dev, log_every=0)  # fmt: skip
    buf = torch.randn(2 * n, device=dev)
    slow.submit(buf, names, last=True).wait()  # agree, allocate
    torch.cuda.synchronize()

    # encode and decode: the host launches them, the stream runs them; the stream is busy
    # with a long kernel first, so the device's spans start well after the host's
    slow.trace(None, steps=None)
    torch.cuda._sleep(cycles)
    t = time.perf_counter()
    slow.submit(buf, names, last=True).wait()  # (a stream wait, like DDP's)
    fut = slow.submit(buf, names, last=True)  # reads what completed, never waits
    out["host_ms"] = (time.perf_counter() - t) * 1e3
    out["unread"] = slow.stats.unread
    fut.wait()
    torch.cuda.synchronize()
    first = slow.stats.steps[-2]
    out["encode_ms"], out["decode_ms"] = first.encode_ms, first.decode_ms
    out["sync_ms"] = first.sync_ms
    slow.tracer.stop()
    spans = slow.tracer.events()
    host = min(e["ts"] for e in spans if e["name"] == "encode" and e["cat"] == "issue")
    on_device = [e for e in spans if e["name"] == "encode" and e["tid"] == DEVICE_LANE]
    out["device_encode_after_host_ms"] = (min(e["ts"] for e in on_device) - host) / 1e3
    out["device_encode_ms"] = max(e["dur"] for e in on_device) / 1e3

    # a collective queued on NCCL's stream behind one that waits for a long kernel: its time
    # is the stream's, from the issue to the end on the NCCL stream
    plain = CaSyncState(None, named_parameters=[("a", n), ("b", n)], device=dev, log_every=0)
    plain.submit(buf, names, last=True).wait()
    torch.cuda.synchronize()
    plain.trace(None, steps=None)
    side = torch.cuda.Stream()
    x = torch.ones(1, device=dev)
    with torch.cuda.stream(side):
        torch.cuda._sleep(cycles)
        dist.all_reduce(x, async_op=True)
    t = time.perf_counter()
    fut = plain.submit(buf, names, last=True)
    out["comm_host_ms"] = (time.perf_counter() - t) * 1e3
    fut.wait()
    torch.cuda.synchronize()
    out["comm_ms"] = plain.stats.last.comm_ms  # type: ignore[union-attr]
    plain.tracer.stop()
    net = [e for e in plain.tracer.events() if e["cat"] == "comm"]
    out["network_ms"] = max(e["dur"] for e in net) / 1e3
    return out


@pytest.fixture(scope="module")
def gpu_run() -> dict[str, Any]:
    return run_workers(_gpu, 1, backend="nccl", timeout=300)[0]


@pytest.mark.cuda
@cuda
def test_encode_and_decode_times_hold_the_device_work(gpu_run: dict[str, Any]) -> None:
    sleep = gpu_run["sleep_ms"]
    # host enqueue times would be microseconds: the figures are the streams'
    assert gpu_run["encode_ms"] >= 0.8 * sleep, gpu_run
    assert gpu_run["decode_ms"] >= 0.8 * sleep, gpu_run
    assert gpu_run["sync_ms"] >= gpu_run["encode_ms"] + 0.8 * sleep, gpu_run


@pytest.mark.cuda
@cuda
def test_nothing_in_a_step_waits_for_the_device(gpu_run: dict[str, Any]) -> None:
    # two steps' submits (each with ~2 sleeps of device work queued behind another) returned
    # while the device still worked: the first step closed unread
    assert gpu_run["host_ms"] < gpu_run["sleep_ms"], gpu_run
    assert gpu_run["unread"] >= 1, gpu_run


@pytest.mark.cuda
@cuda
def test_device_spans_sit_on_the_device_timeline(gpu_run: dict[str, Any]) -> None:
    # the stream was busy for one sleep before the encode: its span starts that much after
    # the host launched it (a host timer would put them together), and lasts a sleep
    sleep = gpu_run["sleep_ms"]
    assert gpu_run["device_encode_after_host_ms"] >= 0.8 * sleep, gpu_run
    assert gpu_run["device_encode_ms"] >= 0.8 * sleep, gpu_run


@pytest.mark.cuda
@cuda
def test_a_collective_time_holds_its_wait_on_the_nccl_stream(gpu_run: dict[str, Any]) -> None:
    sleep = gpu_run["sleep_ms"]
    assert gpu_run["comm_host_ms"] < 0.5 * sleep, gpu_run
    assert gpu_run["comm_ms"] >= 0.8 * sleep, gpu_run
    assert gpu_run["network_ms"] >= 0.8 * sleep, gpu_run
