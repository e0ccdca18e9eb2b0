"""The demo's summary sets the plan's predicted speed-up beside the measured one, warns where
compression lost, and says when CaSync fell back to the plain plan."""

from __future__ import annotations

from hipress.cli.demo import format_summary
from hipress.demo import DemoConfig, DemoResult, EvalPoint, RunResult, RunSpec


def _run(name: str, alg: str | None, speed: float, **extra: object) -> RunResult:
    return RunResult(
        spec=RunSpec(name, alg), plan="-" if alg is None else "4/7 tensors compressed",
        compressed_tensors=0 if alg is None else 4, tensors=7, wall_s=10.0, cpu_s=9.0,
        train_s=8.0, timed_steps=10, samples_per_s=speed, tokens_per_s=speed * 32,
        bytes_per_step=4e6 if alg is None else 1e5, bytes_uncompressed_per_step=4e6,
        bytes_total=1e7, train_loss=[5.0] * 10, evals=[EvalPoint(10, 4.0, 0.3)],
        sync={"encode_ms": 1.0, "decode_ms": 1.0, "sync_ms": 2.0} if alg else {}, **extra,
    )  # fmt: skip


def _summary(speed: float, **extra: object) -> str:
    runs = [_run("uncompressed", None, 50.0), _run("hipress onebit", "onebit", speed, **extra)]
    return format_summary(DemoResult(DemoConfig(steps=10), "corpus", "d", 10**6, runs, 20.0))


def test_losing_compression_is_named() -> None:
    text = _summary(32.0, predicted_speedup=1.7)
    assert "the plan predicted its sync 1.70x faster than uncompressed" in text
    assert "the whole step ran at 0.64x uncompressed's throughput" in text
    assert "warning: hipress onebit ran slower than uncompressed here" in text


def test_winning_compression_and_a_fallback() -> None:
    text = _summary(60.0, predicted_speedup=2.0)
    assert "1.20x" in text and "warning" not in text
    text = _summary(40.0, predicted_speedup=2.0, fell_back=True)
    assert "fell back to the plain plan (all-reduce) on every worker" in text
    assert "warning" not in text
