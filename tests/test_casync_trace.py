"""Step timelines (hipress.casync.trace) and reading them (hipress.timeline)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from dist_utils import run_workers
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from hipress.casync import CaSyncError, register
from hipress.casync.trace import Tracer, trace_path
from hipress.core.plan import Plan, Strategy, TensorPlan
from hipress.timeline import BREAKDOWN, TimelineError, breakdown, load_traces, render_png

# "0.weight" 4096, "2.weight" 12288, "4.weight" 768 elements
LAYOUT = {"0.weight": Strategy.RING, "2.weight": Strategy.ALLGATHER, "4.weight": Strategy.PS}
STEPS = 3


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 96), nn.ReLU(),
                         nn.Linear(96, 8))  # fmt: skip


def _traced(rank: int, world_size: int, out: str, profile: bool) -> list[str]:
    model = _model()
    ddp = DDP(model, bucket_cap_mb=0.02)
    entries = tuple(
        TensorPlan(n, p.numel(), n in LAYOUT, LAYOUT.get(n, Strategy.ALLREDUCE), 1)
        for n, p in model.named_parameters()
    )
    state = register(ddp, "onebit", plan=Plan("onebit", {}, world_size, entries))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 32), torch.randn(16, 8)
    for step in range(2 + STEPS):
        if step == 2:
            state.trace(Path(out) / "run-{rank}.json", steps=STEPS)
        with state.tracer.span("step", "step"):
            with state.tracer.span("forward", "compute"):
                loss = nn.functional.mse_loss(ddp(x), y)
            with state.tracer.span("backward", "compute"):
                loss.backward()
            with state.tracer.span("optimizer", "compute"):
                opt.step()
            opt.zero_grad()
    names: list[str] = []
    if profile:  # every phase is a record_function range in the user's own profile
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            nn.functional.mse_loss(ddp(x), y).backward()
        names = sorted({e.key for e in prof.key_averages() if e.key.startswith("hipress.")})
    assert state.tracer.written == Path(out) / f"run-{rank}.json"
    return names


def test_a_traced_run_writes_one_file_per_rank_with_every_phase(tmp_path: Path) -> None:
    names = run_workers(_traced, 2, str(tmp_path), True)
    assert {"hipress.hook", "hipress.encode", "hipress.decode", "hipress.issue",
            "hipress.wait"} <= set(names[0])  # fmt: skip
    files = sorted(tmp_path.glob("run-*.json"))
    assert [f.name for f in files] == ["run-0.json", "run-1.json"]
    doc = json.loads(files[0].read_text())
    assert doc["metadata"]["rank"] == 0 and doc["metadata"]["algorithm"] == "onebit"
    events = load_traces(files)
    cats = {e["cat"] for e in events}
    assert {"step", "compute", "hook", "encode", "decode", "issue", "wait", "comm"} <= cats
    comm = {e["name"] for e in events if e["cat"] == "comm"}
    assert {"allgather", "PS all_to_all", "PS all-gather", "ring hop", "allreduce"} <= comm
    assert {e["lane"] for e in events if e["cat"] == "comm"} >= {"network"}
    # the trace covers exactly the steps asked for
    assert sum(1 for e in events if e["cat"] == "step" and e["ph"] == "X") == 2 * STEPS

    table = breakdown(events)
    assert set(table["ranks"]) == {"0", "1"}
    for row in table["ranks"].values():
        assert row["steps"] == STEPS
        own = sum(row[k] for k in ("compute", "encode", "decode", "copy", "wait", "python",
                                   "other"))  # fmt: skip
        assert own == pytest.approx(row["step"], abs=1e-3)  # each instant counted once
        assert row["exposed"] == pytest.approx(row["step"] - row["compute"])
        assert row["encode"] > 0 and row["decode_all"] >= row["decode"] and row["network"] > 0

    png = render_png(events, tmp_path / "timeline.png", title="onebit")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_own_times_subtract_nested_spans() -> None:
    def span(cat: str, ts: float, dur: float) -> dict[str, object]:
        return {"name": cat, "cat": cat, "ph": "X", "ts": ts, "dur": dur, "pid": 0, "tid": 1,
                "lane": "main"}  # fmt: skip

    events = [
        span("step", 0, 100_000),
        span("compute", 0, 60_000),  # backward, with a hook call inside
        span("hook", 10_000, 20_000),
        span("encode", 12_000, 5_000),
        span("wait", 20_000, 8_000),
        span("compute", 70_000, 10_000),
    ]
    row = breakdown(events)["mean"]
    assert row["step"] == 100 and row["compute"] == 50
    assert (row["encode"], row["wait"], row["python"], row["other"]) == (5, 8, 7, 30)
    assert list(breakdown(events)["columns"]) == list(BREAKDOWN)


def test_trace_paths_and_bad_input(tmp_path: Path) -> None:
    assert trace_path("t/{rank}.json", 3) == Path("t/3.json")
    assert trace_path("t/run.json", 1) == Path("t/run-rank1.json")
    assert trace_path(tmp_path, 2) == tmp_path / "trace-rank2.json"
    with pytest.raises(CaSyncError, match="steps >= 1"):
        Tracer().record(tmp_path, steps=0)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(TimelineError, match=r"bad\.json: not a trace file"):
        load_traces([bad])
    with pytest.raises(TimelineError, match="no spans"):
        breakdown([])


def test_a_tracer_not_recording_keeps_nothing() -> None:
    tracer = Tracer()
    with tracer.span("encode", "encode"):
        pass
    tracer.interval("allgather", 0.0, 1.0)
    assert tracer.events() == [] and not tracer.recording
    tracer.record(None, steps=None)
    with tracer.span("encode", "encode"):
        pass
    tracer.step_done()
    assert tracer.stop() is None
    assert [e["cat"] for e in tracer.events()] == ["encode", "step"]


def test_the_trace_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hipress.cli import main

    tracer = Tracer(rank=0)
    tracer.record(tmp_path / "t.json", steps=None)
    with (
        tracer.span("step", "step"),
        tracer.span("backward", "compute"),
        tracer.span("hook", "hook"),
        tracer.span("encode", "encode"),
    ):
        torch.randn(1000).sum()
    written = tracer.stop()
    assert written == tmp_path / "t-rank0.json"
    assert main(["trace", str(written), "--json", str(tmp_path / "b.json"),
                 "--png", str(tmp_path / "t.png")]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "| rank 0 |" in out and "| mean |" in out and "wrote" in out
    assert json.loads((tmp_path / "b.json").read_text())["mean"]["step"] > 0
    (tmp_path / "bad.json").write_text("[]")
    with pytest.raises(SystemExit, match="no spans"):
        main(["trace", str(tmp_path / "bad.json")])


def _bare(rank: int, world_size: int, out: str) -> float:
    """A training loop with no spans of its own, traced from its first step: 4 steps, each
    with 30 ms outside CaSync's hook (data loading, say)."""
    import time

    model = _model()
    ddp = DDP(model, bucket_cap_mb=0.02)
    state = register(ddp, "onebit", plan="default")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 32), torch.randn(16, 8)
    state.trace(Path(out) / "bare-{rank}.json", steps=4)
    ends = []
    for _ in range(4):
        time.sleep(0.03)
        nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        ends.append(time.perf_counter())
        opt.zero_grad()
    state.tracer.stop()
    return (ends[-1] - ends[0]) / 3 * 1e3  # ms per step after step 0


def test_without_spans_steps_run_from_optimizer_step_to_optimizer_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hipress.cli import main

    wall = run_workers(_bare, 2, str(tmp_path))
    files = sorted(tmp_path.glob("bare-*.json"))
    table = breakdown(load_traces(files))
    for rank, row in table["ranks"].items():
        assert (row["bounds"], row["steps"], row["left_out"]) == ("optimizer", 3, 1)
        # the whole step, not the hook's time: the 30 ms outside the hook are in it
        assert row["step"] == pytest.approx(wall[int(rank)], rel=0.1, abs=3.0)
        assert row["step"] >= 30 and row["other"] >= 30
        assert row["compute"] is None and row["exposed"] is None  # no compute spans: unknown
        assert row["python"] > 0 and row["step"] > row["python"] + row["wait"] + row["encode"]
    assert main(["trace", *map(str, files)]) == 0
    out = capsys.readouterr().out
    assert "from one optimizer step's end to the next" in out and "step 0" in out
    assert "| step ms | compute ms |" in out and "n/a" in out


def _mark(name: str, ts: float, **args: object) -> dict[str, object]:
    e: dict[str, object] = {"name": name, "cat": "step", "ph": "i", "ts": ts, "pid": 0,
                            "tid": 1, "lane": "main"}  # fmt: skip
    return e | ({"args": args} if args else {})


def test_step_zero_is_left_out_and_several_optimizers_end_one_step() -> None:
    def span(cat: str, ts: float, dur: float) -> dict[str, object]:
        return {"name": cat, "cat": cat, "ph": "X", "ts": ts, "dur": dur, "pid": 0, "tid": 1,
                "lane": "main"}  # fmt: skip

    # the loop's own step spans: step 0 (a 900 ms compile) then two of 100 ms
    events = [span("step", 0, 900_000), _mark("step-end", 800_000, step=0),
              span("compute", 0, 850_000)]  # fmt: skip
    for i in (1, 2):
        t = 900_000 + (i - 1) * 100_000
        events += [span("step", t, 100_000), span("compute", t, 60_000),
                   _mark("step-end", t + 70_000, step=i)]  # fmt: skip
    row = breakdown(events)["ranks"]["0"]
    assert (row["steps"], row["left_out"], row["bounds"]) == (2, 1, "spans")
    assert (row["step"], row["compute"], row["exposed"]) == (100, 60, 40)
    # a GAN's two optimizers: one boundary per CaSync step (the last optimizer step)
    marks = []
    for i, t in enumerate((0, 100_000, 300_000)):
        marks += [_mark("step-end", t + 50_000, step=i + 5), _mark("optimizer-step", t + 60_000),
                  _mark("optimizer-step", t + 70_000)]  # fmt: skip
    row = breakdown(marks)["ranks"]["0"]
    assert (row["steps"], row["left_out"], row["bounds"], row["step"]) == (2, 0, "optimizer", 150)
    # no boundaries at all: the step is not known
    row = breakdown([_mark("step-end", 5.0, step=3), span("hook", 0, 4_000)])["ranks"]["0"]
    assert row["bounds"] == "none" and row["step"] is None and row["python"] == 4
