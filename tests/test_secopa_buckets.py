"""DDP's buckets as SeCoPa models them, the bucket_cap_mb it recommends, row-sparse by the
exposed step, and the same plan from the same inputs."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from dist_utils import run_workers
from hypothesis import given, settings
from hypothesis import strategies as st

from hipress.secopa.model.bucketcap import recommend_cap
from hipress.secopa.model.ddpbuckets import ddp_caps, ready_buckets
from hipress.secopa.model.planner import PlannerConfig, plan_named
from hipress.secopa.model.profile import Profile, Readiness, affine_profile
from hipress.secopa.model.rowcost import RowDensity

GOLDEN = Path(__file__).parent / "golden"
EMB = "embed.weight"
# the bench's lstm-lm (hipress.bench.workloads): its parameters in model order
LSTM_LM = [
    (EMB, 32768 * 512), ("lstm.weight_ih_l0", 1024 * 512), ("lstm.weight_hh_l0", 1024 * 256),
    ("lstm.bias_ih_l0", 1024), ("lstm.bias_hh_l0", 1024), ("lstm.weight_ih_l1", 1024 * 256),
    ("lstm.weight_hh_l1", 1024 * 256), ("lstm.bias_ih_l1", 1024), ("lstm.bias_hh_l1", 1024),
    ("out.head.weight", 2002 * 256), ("out.tail.0.0.weight", 64 * 256),
    ("out.tail.0.1.weight", 6000 * 64), ("out.tail.1.0.weight", 16 * 256),
    ("out.tail.1.1.weight", 24768 * 16),
]  # fmt: skip
ROWS = {EMB: RowDensity(32768, 110, exact=True)}


def _measured() -> Profile:
    """The measured lstm-lm onebit profile with the ready times measured on the bench's
    lstm-lm (one thread), on a 1 Gbit/s link."""
    ready = Readiness.from_dict(json.loads((GOLDEN / "readiness_lstm_lm.json").read_text()))
    prof = Profile.load(GOLDEN / "profile_lstm_lm_onebit_loopback.json")
    return prof.with_link(1.25e8, 25e-6).with_readiness(ready)


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 400_000), min_size=1, max_size=12),
    leads=st.lists(st.integers(0, 5), min_size=12, max_size=12),
    cap=st.sampled_from([0.5, 1.0, 1.5, 2.0, 25.0]),
    first=st.sampled_from([0.25, 1.0]),
)
def test_ready_buckets_are_torchs_rebuild(sizes: list[int], leads: list[int], cap: float,
                                          first: float) -> None:  # fmt: skip
    # torch's own assignment (what Reducer::rebuild_buckets calls) on the gradients in ready
    # order, their indices passed along
    n = len(sizes)
    lead = [float(x) for x in leads[:n]]
    order = sorted(range(n), key=lambda i: (-lead[i], -i))
    got, _ = dist._compute_bucket_assignment_by_size(
        [torch.empty(sizes[i]) for i in order], [int(first * 2**20), int(cap * 2**20)],
        [False] * n, order,
    )  # fmt: skip
    assert [list(b) for b in got] == ready_buckets(sizes, lead, cap, first)


def _bucket_model() -> torch.nn.Module:
    """An embedding (2 MB, ready last) before 3.2 MB of layers: at a 1.5 MB cap DDP's last
    bucket holds it with 1 MB of gradients ready before it."""
    return torch.nn.Sequential(torch.nn.Embedding(4096, 128), torch.nn.Linear(128, 2048),
                               torch.nn.ReLU(), torch.nn.Linear(2048, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 2400))  # fmt: skip


def _record_buckets(rank: int, world: int, cap: float | None) -> dict[str, object]:
    from hipress.casync.buckets import check_buckets, ddp_first_bucket_mb, first_is_cap
    from hipress.secopa.measure.readiness import ReadyClock

    torch.manual_seed(0)
    model = _bucket_model()
    names = {id(p): n for n, p in model.named_parameters()}
    x = torch.randint(0, 4096, (8,))
    clock = ReadyClock(model)  # the real ready order, without DDP
    clock.on = True
    model(x).square().mean().backward()
    clock.step_done()
    clock.remove()
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap)
    seen: dict[int, list[str]] = {}

    def hook(_: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        seen[bucket.index()] = [names[id(p)] for p in bucket.parameters()]
        return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(
            lambda f: f.value()[0])  # fmt: skip

    hook.__annotations__ = {"_": object, "bucket": dist.GradBucket,
                            "return": torch.futures.Future[torch.Tensor]}  # fmt: skip
    ddp.register_comm_hook(None, hook)
    for _ in range(3):  # DDP rebuilds its buckets after the first step
        seen.clear()
        ddp(x).square().mean().backward()
    named = [(n, p) for n, p in model.named_parameters()]
    return {"seen": [seen[i] for i in sorted(seen)], "leads": clock.leads(),
            "numels": [(n, p.numel()) for n, p in named], "first_mb": ddp_first_bucket_mb(ddp),
            "cap_mb": ddp.bucket_bytes_cap / 2**20, "first_is_cap": first_is_cap(),
            "warned": check_buckets(ddp, named)}  # fmt: skip


@pytest.mark.parametrize("cap", [None, 1.5])
def test_ddp_rebuilds_its_buckets_as_predicted(cap: float | None) -> None:
    r = run_workers(_record_buckets, 2, cap, timeout=120)[0]
    caps = ddp_caps(cap, r["first_is_cap"])
    assert (caps.cap_mb, caps.first_mb) == (r["cap_mb"], r["first_mb"])
    names = [n for n, _ in r["numels"]]
    leads = [r["leads"][n] for n in names]
    want = ready_buckets([k for _, k in r["numels"]], leads, caps.cap_mb, caps.first_mb)
    assert r["seen"] == [[names[i] for i in b] for b in want]
    # at 1.5 MB the embedding (2 MB, ready last) closes a bucket holding 1 MB ready before it
    assert len(r["warned"]) == (cap is not None)
    if r["warned"]:
        assert "0.weight (2.0 MB" in r["warned"][0] and "1.0 MB of gradients" in r["warned"][0]
        assert "bucket_cap_mb=" in r["warned"][0]


def test_recommends_the_cap_that_lets_early_gradients_leave(
    caplog: pytest.LogCaptureFixture,
) -> None:
    prof = _measured()
    with caplog.at_level(logging.INFO, logger="hipress.secopa.model.bucketcap"):
        advice = recommend_cap(LSTM_LM, prof, 2, PlannerConfig(strategies=()), ROWS)
    default = advice.exposed_ms[ddp_caps(None).label()]
    assert not advice.caps.default and advice.caps.cap_mb <= 4
    assert advice.exposed_ms[advice.caps.label()] < 0.5 * default
    assert "embed.weight (64.0 MB)" in advice.reason and "bucket_cap_mb=" in advice.reason
    assert advice.plan.entries[0].row_bound > 0  # the embedding as rows
    assert advice.reason in caplog.text
    saved = advice.to_dict()
    assert saved["bucket_cap_mb"] == advice.caps.cap_mb and saved["reason"] == advice.reason


def test_close_calls_take_the_default_else_the_largest_cap_and_are_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # every gradient ready at the end: no cap lets anything leave sooner, fewer buckets win
    prof = _measured().with_readiness(Readiness({n: 0.0 for n, _ in LSTM_LM}))
    prof = prof.with_link(1.25e11, 0.0)
    with caplog.at_level(logging.INFO, logger="hipress.secopa.model.bucketcap"):
        advice = recommend_cap(LSTM_LM, prof, 2, PlannerConfig(strategies=()))
    assert advice.caps.cap_mb == 256 and "256 MB" in advice.tied and len(advice.tied) > 1
    assert "took 256 MB" in caplog.text
    # a model within one bucket at every cap: all tie, DDP's default (nothing to change) wins
    small = recommend_cap([("a", 1000), ("b", 1000)], prof, 2, PlannerConfig(strategies=()))
    assert small.caps.default and len(small.tied) == 9
    assert small.reason.startswith("keep DDP's default")


def test_rows_are_chosen_by_the_exposed_step() -> None:
    # a 2-D tensor ready long before backward ends hides its dense link time; its rows' scan
    # runs on the cores backward needs: cheaper alone, dearer for the step
    named = [("early", 4096 * 256), ("late", 8192 * 256)]
    prof = affine_profile("onebit", encode=(1e-6, 0.05, 0.05), decode=(1e-6, 0.05, 0.05),
                          merge=(1e-5, 0.05, 0.05), bytes_per_element=1 / 32, header=8,
                          bandwidth_bytes_per_s=1.25e8)  # fmt: skip
    prof = prof.with_readiness(Readiness({"early": 200.0, "late": 0.0}, backward_ms=200.0))
    rows = {"early": RowDensity(4096, 40, exact=True), "late": RowDensity(8192, 40, exact=True)}
    cfg = PlannerConfig(strategies=())
    plan = plan_named(named, prof, 2, cfg, rows)
    early, late = plan.meta["row_prices"]["early"], plan.meta["row_prices"]["late"]
    assert early["objective"] == "exposed step" and early["chosen"] == "dense"
    assert early["breakeven"] == -1 and early["breakeven_alone"] >= 40  # rows won alone
    assert late["chosen"] == "rows" and late["breakeven"] >= 40
    assert [e.row_bound > 0 for e in plan.entries] == [False, True]
    sums = plan_named(named, prof.with_readiness(None), 2, cfg, rows)  # today's rule
    assert [e.row_bound > 0 for e in sums.entries] == [True, True]


def _plan_json() -> str:
    advice = recommend_cap(LSTM_LM, _measured(), 2, PlannerConfig(), ROWS)
    return json.dumps({"plan": json.loads(advice.plan.to_json()), "advice": advice.to_dict()},
                      sort_keys=True)  # fmt: skip


def test_the_same_inputs_give_the_same_plan_ten_times_two_in_fresh_processes() -> None:
    # the plan and the recommended cap, 8 times here, then in 2 fresh interpreters with other
    # string hash seeds (set and dict orders)
    first = _plan_json()
    assert all(_plan_json() == first for _ in range(7))
    code = "from test_secopa_buckets import _plan_json; print(_plan_json())"
    here = Path(__file__).resolve().parent
    for seed in ("1", "4242"):  # another str hash order
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(here)}
        out = subprocess.run([sys.executable, "-c", code], cwd=here.parent, env=env, check=True,
                             capture_output=True, text=True, timeout=300).stdout  # fmt: skip
        assert out.strip().splitlines()[-1] == first


def test_hipress_plan_prints_and_stores_the_recommended_cap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hipress.cli import main
    from hipress.core.plan import Plan

    (tmp_path / "m.py").write_text(
        "import torch\n\ndef make():\n    return torch.nn.Sequential(torch.nn.Embedding(32768, "
        "512), torch.nn.Linear(512, 2048), torch.nn.Linear(2048, 1024))\n")  # fmt: skip
    ready = {"0.weight": 0.0, "1.weight": 60.0, "1.bias": 60.0, "2.weight": 90.0, "2.bias": 90.0}
    (tmp_path / "ready.json").write_text(json.dumps(ready))
    # the embedding as rows, the 4 MB layer plain: its bytes are what the buckets hold back
    argv = ["plan", "--model", f"{tmp_path / 'm.py'}:make", "--workers", "2", "--bandwidth",
            "1gbit", "--profile", str(GOLDEN / "profile_lstm_lm_onebit_loopback.json"),
            "--exclude", "1.weight", "--row-density", "0.004"]  # fmt: skip
    out = tmp_path / "plan.json"
    assert main([*argv, "--readiness", str(tmp_path / "ready.json"), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    # DDP's default: the 16 MB first bucket closes alone, the 4 MB layer waits for the embedding
    assert "recommended DDP bucket cap: bucket_cap_mb=" in text and "0.weight (64.0 MB)" in text
    saved = Plan.load(out).meta["bucket_cap"]
    assert saved["bucket_cap_mb"] <= 4 and saved["reason"] in text
    assert f"re-plan with --bucket-cap-mb {saved['bucket_cap_mb']:g}" in text
    assert main(argv) == 0  # no ready times: no recommendation, and it says why
    assert "no recommendation without the gradients' ready times" in capsys.readouterr().out
    (tmp_path / "other.json").write_text(json.dumps({"embed.weight": 0.0}))
    assert main([*argv, "--readiness", str(tmp_path / "other.json")]) == 2
    assert "names none of" in capsys.readouterr().err


def test_the_waiting_gradients_count_as_the_plan_sends_them() -> None:
    """In the LSTM LM's last bucket (DDP's default cap) 8.5 MB of fp32 gradients wait for the
    embedding: worth a warning when they are sent as they are, not when onebit sends them in
    about a 32nd of that (more buckets would cost more than their wait)."""
    from hipress.casync.buckets import late_merges
    from hipress.compll import load

    caps = ddp_caps(None)
    plain = late_merges(LSTM_LM, caps.cap_mb, caps.first_mb)
    assert [m["name"] for m in plain] == [EMB] and plain[0]["waiting_mb"] > 8
    assert plain[0]["waiting_wire_mb"] == plain[0]["waiting_mb"]
    onebit = load("onebit")
    wire = {n: onebit.payload_nbytes(k) if k >= 1 << 16 else 4 * k for n, k in LSTM_LM}
    assert late_merges(LSTM_LM, caps.cap_mb, caps.first_mb, wire) == []
    # sent as fp16 (half the bytes) they still wait 4 MB: warned, with both sizes
    half = {n: 2 * k for n, k in LSTM_LM}
    (m,) = late_merges(LSTM_LM, caps.cap_mb, caps.first_mb, half)
    assert m["waiting_wire_mb"] == pytest.approx(m["waiting_mb"] / 2)


def _register_warns(rank: int, world: int, algorithm: str | None) -> list[str]:
    import hipress.casync

    torch.manual_seed(0)
    model = _bucket_model()
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1.5)
    got: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: got.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("hipress.casync.buckets")
    logger.addHandler(handler)
    try:
        state = hipress.casync.register(ddp, algorithm, log_every=0)
    finally:
        logger.removeHandler(handler)
    state.close()
    return got


@pytest.mark.parametrize("algorithm", [None, "onebit"])
def test_register_warns_only_where_the_waiting_bytes_are_many_as_sent(
    algorithm: str | None,
) -> None:
    """1 MB of fp32 gradients waits for the embedding (2 MB, ready last) in DDP's last bucket
    at a 1.5 MB cap: sent uncompressed that is worth the warning (once, on rank 0); compressed
    by onebit it is 32 KB, and register says nothing."""
    first, second = run_workers(_register_warns, 2, algorithm, timeout=120)
    if algorithm is None:
        assert len(first) == 1 and "1.0 MB of gradients ready before it" in first[0], first
    else:
        assert first == []
    assert second == []
