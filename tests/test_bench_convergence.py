"""hipress bench convergence, small: real 2-process gloo runs of both tasks (the LSTM LM and the
tabular classifier), over seeds, the momentum hand-over to dgc, and the FSDP2 mode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hipress.bench.convergence import (
    ConvergenceOptions,
    check_convergence,
    convergence_markdown,
    density_schedule,
    run_convergence,
    summarise,
)
from hipress.bench.convergence_options import TASKS, fsdp_refusal
from hipress.bench.convergence_train import HeavyBall
from hipress.bench.tables import convergence_rows
from hipress.bench.workloads import TabularMLP, tabular_data
from hipress.cli import main


def test_convergence_rows_and_dgc_momentum() -> None:
    opts = ConvergenceOptions(
        workers=2, algorithms=("topk", "dgc"), epochs=2, train_tokens=4096,
        eval_tokens=2048, batch=4, timeout=300, density_warmup_epochs=1,
    )  # fmt: skip
    res = run_convergence(opts)
    rows = {r["algorithm"]: r for r in res["rows"]}
    assert list(rows) == ["uncompressed", "topk", "dgc"]
    for r in rows.values():
        assert "error" not in r, r.get("error")
        assert 0.0 <= r["accuracy"] <= 1.0 and r["finite"]
        assert r["steps"] == rows["uncompressed"]["steps"] > 20
        (run,) = r["runs"]  # one seed: the summary is that run
        assert run["seed"] == 0 and r["accuracy"] == run["accuracy"]
        # evaluated after every epoch; the last is the final accuracy
        assert len(run["epoch_accuracy"]) == 2 and run["epoch_accuracy"][-1] == run["accuracy"]
        assert run["best_accuracy"] == max(run["epoch_accuracy"]) == r["best_accuracy"]
        assert run["epoch_accuracy"][run["best_epoch"] - 1] == run["best_accuracy"]
    assert rows["uncompressed"]["delta_points"] == 0.0
    best = rows["uncompressed"]["best_accuracy"]
    assert rows["dgc"]["best_delta_points"] == 100 * (rows["dgc"]["best_accuracy"] - best)
    assert rows["topk"]["error_feedback"] and rows["dgc"]["error_feedback"]
    # DGC's momentum correction replaces the optimizer's on the compressed parameters (from
    # the first step: no warm-up, so nothing to hand over); the others keep it
    dgc_run, topk_run = rows["dgc"]["runs"][0], rows["topk"]["runs"][0]
    assert dgc_run["optimizer_momentum"] == 0.0 and dgc_run["momentum_handed_over"] == 0
    assert topk_run["optimizer_momentum"] == opts.momentum
    table = convergence_markdown(res)
    assert "| dgc | yes |" in table and "| uncompressed | - |" in table
    assert "density warm-up: 1 epoch(s)" in table and "Seeds: 0." in table


def test_tabular_task_over_seeds_hands_momentum_to_dgc() -> None:
    """Two seeds of the tabular task with one epoch of CaSync warm-up: each seed is its own
    run (different weights and order), the summary is their mean and range, and dgc takes
    over the optimizer's momentum buffer of every compressed element when compression
    starts."""
    opts = ConvergenceOptions(
        workers=2, algorithms=("dgc",), epochs=2, task="tabular", seeds=(0, 1),
        train_samples=1024, eval_samples=512, warmup_epochs=1, timeout=300,
    )  # fmt: skip
    res = run_convergence(opts)
    base, dgc = res["rows"]
    assert "error" not in dgc, dgc.get("error")
    assert [x["seed"] for x in base["runs"]] == [0, 1]
    assert base["runs"][0]["epoch_accuracy"] != base["runs"][1]["epoch_accuracy"]
    finals = [x["accuracy"] for x in base["runs"]]
    assert base["final"]["min"] == min(finals) and base["final"]["max"] == max(finals)
    assert base["accuracy"] == pytest.approx(sum(finals) / 2)
    assert base["steps"] == 2 * (1024 // 64)
    # both weights of more than 64k elements are compressed, every element of each encoded
    # by this rank (PS: one shard per server), so all of their momentum moves over
    assert [x["momentum_handed_over"] for x in dgc["runs"]] == [2048 * 32 + 2048 * 256] * 2
    assert all(x["optimizer_momentum"] == 0.0 for x in dgc["runs"])
    # the warm-up epoch is uncompressed, bit for bit: the same first epoch as uncompressed
    for b, d in zip(base["runs"], dgc["runs"], strict=True):
        assert d["epoch_accuracy"][0] == b["epoch_accuracy"][0]
    assert res["meta"]["task_name"] == "tabular" and res["meta"]["seeds"] == [0, 1]
    table = convergence_markdown(res)
    assert "teacher-student" in table and "Seeds: 0, 1." in table


def test_fsdp_mode_is_the_same_job_sharded() -> None:
    """FSDP2 mode: plain FSDP2 trains as DDP does; a cast (fp16) agrees with it closely; the
    uncompressed warm-up epoch is plain FSDP2's bit for bit, compression starts after it (with
    the feedback option of an ``alg:feedback`` entry); dgc, which needs CaSync's momentum
    hand-over, is refused without running."""
    kw = dict(workers=2, epochs=2, train_tokens=2048, eval_tokens=1024, batch=4, timeout=300,
              warmup_epochs=1)  # fmt: skip
    res = run_convergence(
        ConvergenceOptions(algorithms=("fp16", "onebit:bf16", "dgc"), fsdp=True, **kw)
    )
    ddp = run_convergence(ConvergenceOptions(algorithms=(), **kw))["rows"][0]["runs"][0]
    rows = {r["algorithm"]: r for r in res["rows"]}
    assert list(rows) == ["uncompressed", "fp16", "onebit:bf16", "dgc"]
    plain, fp16, onebit = (rows[n]["runs"][0] for n in ("uncompressed", "fp16", "onebit:bf16"))
    for ours, ref in ((plain, ddp), (fp16, plain)):
        assert ours["epoch_accuracy"] == pytest.approx(ref["epoch_accuracy"], abs=2e-3)
        assert ours["epoch_valid_loss"] == pytest.approx(ref["epoch_valid_loss"], rel=1e-4)
    assert plain["units"] is None and "feedback" not in plain
    # the warm-up epoch goes through FSDP2's own reduce-scatter; then 1-bit gradients
    assert onebit["epoch_valid_loss"][0] == plain["epoch_valid_loss"][0]
    assert onebit["epoch_valid_loss"][1] != pytest.approx(plain["epoch_valid_loss"][1], rel=1e-3)
    assert onebit["feedback"] == "bf16" and rows["onebit:bf16"]["error_feedback"]
    assert onebit["units"]["embed"] == [8192 * 128, False]  # embeddings stay plain by default
    assert fp16["feedback"] == "none" and rows["fp16"]["error_feedback"] is False
    assert "without --fsdp" in rows["dgc"]["error"] and rows["dgc"]["runs"] == []
    table = convergence_markdown(res)
    assert "FSDP2 (fully_shard), not DDP" in table and "| onebit:bf16 | yes |" in table


def test_fsdp_options_are_checked() -> None:
    with pytest.raises(ValueError, match="needs the FSDP2 mode"):
        ConvergenceOptions(algorithms=("onebit:bf16",))
    with pytest.raises(ValueError, match="plan"):
        ConvergenceOptions(fsdp=True, plan="auto")
    with pytest.raises(ValueError, match=r"onebit:none: .*own error feedback"):
        check_convergence(ConvergenceOptions(algorithms=("onebit:none",), fsdp=True))
    with pytest.raises(ValueError, match="unknown algorithm"):
        check_convergence(ConvergenceOptions(algorithms=("nope",), fsdp=True))
    assert check_convergence(
        ConvergenceOptions(algorithms=("terngrad", "onebit:bf16"), fsdp=True, fsdp_feedback="int8")
    ) == {"terngrad": "int8", "onebit:bf16": "bf16"}
    assert fsdp_refusal("topk", ConvergenceOptions(density_warmup_epochs=1)) is not None
    assert fsdp_refusal("topk", ConvergenceOptions()) is None
    assert fsdp_refusal("dgc", ConvergenceOptions(momentum_handover=False)) is None


def test_summarise_pairs_seeds() -> None:
    """Means over seeds; gaps of the means, and per-seed gaps against the same seed."""

    def run(seed: int, final: float, best: float) -> dict[str, object]:
        return {"seed": seed, "accuracy": final, "best_accuracy": best, "best_epoch": 2,
                "valid_loss": 1.0, "seconds": 1.0, "steps": 10, "finite": True}  # fmt: skip

    rows = [
        {"algorithm": "uncompressed", "error_feedback": None,
         "runs": [run(0, 0.50, 0.55), run(1, 0.60, 0.65)]},
        {"algorithm": "x", "error_feedback": True,
         "runs": [run(0, 0.49, 0.56), run(1, 0.57, 0.62)]},
        {"algorithm": "y", "error_feedback": True, "runs": [], "error": "boom"},
    ]  # fmt: skip
    summarise(rows)
    x = rows[1]
    assert x["accuracy"] == pytest.approx(0.53) and x["best_accuracy"] == pytest.approx(0.59)
    assert x["delta_points"] == pytest.approx(-2.0)
    assert x["best_delta_points"] == pytest.approx(-1.0)
    assert x["delta_range"] == pytest.approx([-3.0, -1.0])
    assert x["best_delta_range"] == pytest.approx([-3.0, 1.0])
    assert x["final"]["min"] == 0.49 and x["best"]["max"] == 0.62
    assert "accuracy" not in rows[2]
    lines = convergence_rows({"rows": rows})
    assert "| x | yes | 53.00 (49.00-57.00) | -2.00 (-3.00..-1.00) |" in lines[3]
    assert "failed: boom" in lines[4]


def test_heavy_ball_is_sgds_momentum() -> None:
    """SGD without momentum after :class:`HeavyBall` takes SGD-with-momentum's steps."""
    data = tabular_data(256, 64)
    torch.manual_seed(0)
    a = TabularMLP(hidden=64)
    b = TabularMLP(hidden=64)
    b.load_state_dict(a.state_dict())
    opt_a = torch.optim.SGD(a.parameters(), lr=0.1, momentum=0.9)
    opt_b = torch.optim.SGD(b.parameters(), lr=0.1, momentum=0.0)
    hb = HeavyBall(list(b.parameters()), 0.9)
    for i in range(5):
        x, y = data.train_x[i * 32 : i * 32 + 32], data.train_y[i * 32 : i * 32 + 32]
        for model, opt in ((a, opt_a), (b, opt_b)):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            if model is b:
                hb.apply()
            opt.step()
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pa, pb)
    first = next(b.parameters())
    assert hb.pop(first) is not None and hb.pop(first) is None


def test_tabular_data_is_deterministic_and_not_trivial() -> None:
    d1, d2 = tabular_data(512, 256), tabular_data.__wrapped__(512, 256)
    assert torch.equal(d1.train_x, d2.train_x) and torch.equal(d1.valid_y, d2.valid_y)
    assert 0.6 < d1.bayes < 0.95  # noisy labels: nothing reaches 100%
    assert len(set(d1.train_y.tolist())) == 10


def test_density_schedule_is_dgcs_warm_up() -> None:
    """25%, 6.25%, 1.5625%, ... of the elements, 4x fewer each epoch, then the algorithm's own
    fraction; for drop_ratio the complement; nothing for algorithms that do not sparsify."""
    assert density_schedule("dgc", 4, 10) == [
        (0, {"s_percent": 0.25}),
        (10, {"s_percent": 0.0625}),
        (20, {"s_percent": 0.015625}),
        (30, {"s_percent": 0.00390625}),
        (40, {"s_percent": 0.001}),
    ]
    # never denser than needed: topk's own 1% is reached in the fourth epoch
    assert density_schedule("topk", 5, 7)[3:] == [(21, {"ratio": 0.01})]
    assert density_schedule("graddrop", 1, 5) == [
        (0, {"drop_ratio": 0.75}),
        (5, {"drop_ratio": 0.99}),
    ]
    # after CaSync's uncompressed warm-up: counted from the first compressed step
    assert density_schedule("graddrop", 1, 5, start=3) == [
        (3, {"drop_ratio": 0.75}),
        (8, {"drop_ratio": 0.99}),
    ]
    assert density_schedule("onebit", 4, 10) == [] and density_schedule("dgc", 0, 10) == []


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="unknown task"):
        ConvergenceOptions(task="imagenet")
    with pytest.raises(ValueError, match="seeds"):
        ConvergenceOptions(seeds=(0, 0))


def test_gpt_task_from_the_command_line(tmp_path: Path) -> None:
    """``--task gpt``: the GPT-2-style LM (tied) in 128-token windows, uncompressed and with an
    algorithm, written as convergence-gpt.json."""
    args = [
        *("bench", "convergence", "--task", "gpt", "--workers", "2", "--algorithms", "topk"),
        *("--epochs", "1", "--train-tokens", "2048", "--batch", "2", "--out", str(tmp_path)),
    ]
    assert main(args) == 0
    res = json.loads((tmp_path / "convergence-gpt.json").read_text())
    m = res["meta"]
    assert m["task_name"] == "gpt" and m["bptt"] == 128 and m["lr"] == TASKS["gpt"].lr
    base, topk = res["rows"]
    assert [r["algorithm"] for r in res["rows"]] == ["uncompressed", "topk"]
    for r in res["rows"]:
        assert "error" not in r, r.get("error")
        assert r["finite"] and 0.0 <= r["accuracy"] <= 1.0
        assert r["steps"] == (2047 // 128) // (2 * 2)  # 15 windows, 4 per step
    # the same weights and batches: only the gradient exchange differs
    assert topk["runs"][0]["train_loss"] != base["runs"][0]["train_loss"]
    assert "128-token windows" in (tmp_path / "convergence-gpt.md").read_text()
    # --include: the tied embedding, kept plain by every plan, compressed too
    out = tmp_path / "incl"
    assert main([*args[:-1], str(out), "--include", "embed.weight"]) == 0
    res = json.loads((out / "convergence-gpt.json").read_text())
    assert res["meta"]["include"] == ["embed.weight"]
    assert res["rows"][0]["runs"][0]["train_loss"] == base["runs"][0]["train_loss"]
    assert res["rows"][1]["runs"][0]["train_loss"] != topk["runs"][0]["train_loss"]


def test_gpt_untied_task_sharded_by_fsdp() -> None:
    """The untied GPT under FSDP2: the token embedding, each block and the head are units,
    compressed where they pass the size threshold; the tied one's embedding stays in the
    root (the head computes with it outside the embedding's forward)."""
    kw = dict(workers=2, epochs=1, train_tokens=2048, eval_tokens=1024, batch=2, timeout=300,
              vocab=2048, fsdp=True, algorithms=("onebit:bf16",))  # fmt: skip
    rows = run_convergence(ConvergenceOptions(task="gpt-untied", **kw))["rows"]
    assert [r.get("error") for r in rows] == [None, None]
    units = rows[1]["runs"][0]["units"]
    # the token embedding stays plain by default; the head compresses
    assert units["embed"] == [2048 * 128, False] and units["head"] == [2048 * 128, True]
    assert {f"blocks.{i}" for i in range(4)} <= set(units)
    tied = run_convergence(ConvergenceOptions(task="gpt", **kw))["rows"]
    assert [r.get("error") for r in tied] == [None, None]
    assert not {"embed", "head"} & set(tied[1]["runs"][0]["units"])


def test_local_step_mode_beside_ddp() -> None:
    """A local-step row (hipress's DiLoCo with onebit, H 2) trains the same tabular job as DDP,
    evaluated at the global weights, with its loss curve and time to DDP's final loss."""
    from hipress.bench.convergence_local import local_markdown

    opts = ConvergenceOptions(task="tabular", workers=2, algorithms=(), epochs=2,
                              train_samples=512, eval_samples=256, timeout=300,
                              local_steps=("diloco-onebit-h2",), local_epochs=3)  # fmt: skip
    res = run_convergence(opts)
    ddp, local = res["rows"]
    assert [r["algorithm"] for r in res["rows"]] == ["uncompressed", "diloco-onebit-h2"]
    assert [r.get("error") for r in res["rows"]] == [None, None]
    assert local["error_feedback"] is True and ddp["error_feedback"] is None
    assert local["local_steps"] == {"kind": "diloco", "h": 2, "algorithm": "onebit",
                                    "fragments": 1, "delay": 0}  # fmt: skip
    for r, steps in ((ddp, 16), (local, 24)):  # the local row trains a third epoch
        run = r["runs"][0]
        assert r["steps"] == steps and len(run["loss_curve"]) == len(run["elapsed"]) == steps
        assert run["elapsed"] == sorted(run["elapsed"]) and r["finite"]
        # losses and accuracy at DDP's tokens: the trailing mean at step 16, 2 evaluations
        assert r["final_train_loss"] == pytest.approx(sum(run["loss_curve"][8:16]) / 8)
        assert len(run["epoch_accuracy"]) == 2
    # DDP reaches its own final loss at its last step at the latest
    assert 0 < ddp["time_to_ddp_loss_s"] <= ddp["runs"][0]["elapsed"][-1]
    assert ddp["time_vs_ddp"] == 1.0 and ddp["steps_vs_ddp"] == 1.0
    assert local["runs"][0]["loss_curve"] != ddp["runs"][0]["loss_curve"]
    table = "\n".join(local_markdown(res))
    assert "| diloco-onebit-h2 |" in table and "| uncompressed |" in table
    with pytest.raises(ValueError, match="local-step variant 'diloco-x-h2'"):
        ConvergenceOptions(local_steps=("diloco-x-h2",))
    with pytest.raises(ValueError, match="leave out --fsdp"):
        ConvergenceOptions(local_steps=("h2",), fsdp=True)
    with pytest.raises(ValueError, match=r"local_epochs \(1\) must be at least epochs \(2\)"):
        ConvergenceOptions(local_steps=("h2",), local_epochs=1)
    with pytest.raises(ValueError, match="name them too"):
        ConvergenceOptions(local_epochs=3)


def test_time_to_loss_takes_trailing_means() -> None:
    from hipress.bench.convergence_local import time_to_loss

    def row(losses: list[float]) -> dict[str, object]:
        return {"runs": [{"loss_curve": losses, "elapsed": [float(i + 1) for i in range(6)]}]}

    rows = [row([4, 3, 2, 2, 1, 1]), row([4, 0, 4, 1, 1, 1]), row([5, 5, 5, 5, 5, 5])]
    time_to_loss(rows, 2)  # DDP's final trailing mean: 1.0
    assert [r["time_to_ddp_loss_s"] for r in rows] == [6.0, 5.0, None]
    assert [r["time_vs_ddp"] for r in rows] == [1.0, 5 / 6, None]
    # a row trained longer reaches it after DDP's tokens: its loss at equal tokens is step 6's
    longer = {"runs": [{"loss_curve": [5, 5, 5, 5, 3, 3, 1, 1],
                        "elapsed": [float(i + 1) for i in range(8)]}]}  # fmt: skip
    time_to_loss([rows[0], longer], 2)
    assert longer["time_to_ddp_loss_s"] == 8.0 and longer["steps_vs_ddp"] == 8 / 6
    assert longer["final_train_loss"] == 3.0


def test_time_to_loss_per_seed_against_ddp_with_the_same_seed() -> None:
    """With several seeds each seed's time is taken against DDP's run with that seed (its own
    target loss and time); the table shows their mean and range, "-" unless every seed got
    there."""
    from hipress.bench.convergence_local import local_markdown, time_to_loss

    def run(losses: list[float], dt: float) -> dict[str, object]:
        return {"loss_curve": losses, "elapsed": [dt * (i + 1) for i in range(len(losses))]}

    ddp = {"algorithm": "uncompressed", "valid_loss": 5.0,
           "runs": [run([3, 2, 1, 1], 1.0), run([3, 3, 2, 2], 2.0)]}  # fmt: skip
    fast = {"algorithm": "fast", "valid_loss": 5.0,
            "runs": [run([1, 1, 1, 1], 1.0), run([2, 2, 2, 2], 1.0)]}  # fmt: skip
    slow = {"algorithm": "slow", "valid_loss": 5.0,
            "runs": [run([1, 1, 1, 1], 1.0), run([3, 3, 3, 3], 1.0)]}  # fmt: skip
    time_to_loss([ddp, fast, slow], 2)
    # trailing means over 2 steps: seed 0's DDP reaches 1.0 at 4 s, fast 1.0 at 1 s; seed 1's
    # DDP reaches 2.0 at 8 s, fast at 1 s, slow never
    assert fast["time_vs_ddp_seeds"] == [0.25, 0.125]
    assert fast["time_vs_ddp"] == 0.25  # seed 0's, as with one seed
    assert slow["time_vs_ddp_seeds"] == [0.25, None]
    table = "\n".join(local_markdown({"rows": [ddp, fast, slow]}))
    assert "| 0.19 (0.12-0.25) |" in table
    assert table.splitlines()[-1].endswith("| - |")
