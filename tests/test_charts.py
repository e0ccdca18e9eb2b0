"""The charts (hipress.bench.charts, hipress.bench.charts_results) and their commands: a plan made
by ``hipress plan``, ``hipress bench kernels``' JSON and the predicted-against-measured results
(the checked-in ``hipress bench plan`` and ``hipress demo`` results), each drawn to a PNG; what
each figure holds; and a clear message without matplotlib or for a file of another kind."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from matplotlib.colors import to_rgba

from hipress.bench.charts import ChartError, plan_figure
from hipress.bench.charts_results import kernels_figure, prediction_figure
from hipress.cli import main
from hipress.core.plan import Plan
from hipress.core.rule import DefaultRule
from hipress.secopa.model.specs import resolve_model

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"


def png_size(path: Path) -> tuple[int, int]:
    """Width and height of a PNG; fails unless ``path`` is one."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert head[12:16] == b"IHDR"
    w, h = struct.unpack(">II", head[16:24])
    return w, h


def check_png(path: Path, min_px: tuple[int, int] = (500, 350)) -> None:
    w, h = png_size(path)
    assert min_px[0] <= w <= 3000 and min_px[1] <= h <= 3000, (w, h)
    assert 10_000 < path.stat().st_size < 2_000_000


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A plan of the built-in mlp by ``hipress plan`` from a profile of constants."""
    from hipress.secopa.model.profile import affine_profile

    d = tmp_path_factory.mktemp("charts")
    affine_profile("terngrad", encode=(2e-7, 0.02, 0.02), decode=(1e-7, 0.01, 0.01),
                   merge=(5e-8, 0.005, 0.005), bytes_per_element=0.25, header=16,
                   params={"bitwidth": 2}).save(d / "profile.json")  # fmt: skip
    argv = ["plan", "--model", "mlp", "--workers", "4", "--profile", str(d / "profile.json"),
            "--bandwidth", "100mbit", "--algorithm", "terngrad", "--out", str(d / "plan.json"),
            "--png", str(d / "plan.png")]  # fmt: skip
    assert main(argv) == 0
    check_png(d / "plan.png")  # hipress plan --png
    return d / "plan.json"


def test_a_plan_chart_has_a_bar_per_tensor_coloured_by_decision(
    planned: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = Plan.load(planned)
    assert main(["chart", "plan", str(planned), "-o", str(tmp_path / "p.png")]) == 0
    assert f"wrote {tmp_path / 'p.png'}" in capsys.readouterr().out
    check_png(tmp_path / "p.png")
    ax = plan_figure(plan, "mlp").axes[0]
    bars = list(ax.containers[0])
    assert len(bars) == len(plan.entries) == 8
    plain = [b for b in bars if b.get_facecolor() == to_rgba("0.65")]
    assert len(plain) == sum(not e.compress for e in plan.entries)
    assert [b.get_width() for b in bars] == [e.predicted_ms for e in plan.entries]
    assert "(ms)" in ax.get_xlabel()
    assert "mlp" in ax.get_title() and "4 workers" in ax.get_title()
    names = [t.get_text() for t in ax.get_yticklabels()]
    assert names[0].startswith(plan.entries[0].name) and names[0].endswith(("KB)", "MB)"))


def test_a_big_plan_shows_its_largest_tensors_and_a_rule_plan_its_sizes() -> None:
    named = resolve_model("resnet50").named_numels()
    rule = DefaultRule()
    plan = Plan("onebit", {}, 2, tuple(rule.entry(n, k, 2) for n, k in named))
    ax = plan_figure(plan, limit=12).axes[0]
    assert len(ax.containers[0]) == 12
    assert "the 12 largest of 161 tensors" in ax.get_title()
    assert ax.get_xlabel().startswith("gradient size (MB)")  # no predictions in a rule's plan
    widths = sorted(b.get_width() for b in ax.containers[0])
    largest = sorted(4 * k / 1e6 for _, k in named)[-12:]
    assert widths == pytest.approx(largest)


def test_the_kernels_chart_puts_each_kernel_under_its_roofline(tmp_path: Path) -> None:
    results = json.loads((RESULTS / "kernels.json").read_text())
    fig = kernels_figure(results)
    enc, dec = fig.axes
    n = len(results["kernels"])
    assert len(enc.containers[0]) == n == len(dec.containers[0])  # the generated kernels
    assert len(enc.containers[1]) == n  # the torch-ops versions beside them
    assert "GB/s" in enc.get_ylabel() and "GB/s" in dec.get_ylabel()
    assert "67,108,864 elements" in enc.get_title()
    row = results["kernels"]["onebit"]["1048576"]
    small = kernels_figure(results, size=1048576).axes[0]
    pct = [t.get_text() for t in small.texts]
    assert f"{100 * row['encode'] / row['encode_roofline']:.0f}%" in pct
    with pytest.raises(ChartError, match="no kernel measured at 5 elements"):
        kernels_figure(results, size=5)


def test_bench_kernels_writes_its_chart_next_to_its_json(tmp_path: Path) -> None:
    out = tmp_path / "k" / "kernels.json"
    argv = ["bench", "kernels", "--sizes", "1K", "--algorithms", "bf16", "--reps", "1",
            "--no-torch", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    check_png(out.with_suffix(".png"))
    assert main([*argv[:-1], str(tmp_path / "n.json"), "--no-chart"]) == 0
    assert not (tmp_path / "n.png").exists()


def test_predicted_against_measured_of_a_plan_benchmark_and_the_demo(tmp_path: Path) -> None:
    bench = json.loads((RESULTS / "plan.json").read_text())
    ax = prediction_figure(bench).axes[0]
    predicted, measured = ax.containers
    assert len(predicted) == len(bench["rows"]) == len(measured)
    assert measured[0].get_height() == bench["rows"]["planned"]["measured_ms"]
    assert ax.get_ylabel() == "sync time per step (ms)"
    demo = json.loads((RESULTS / "demo.json").read_text())
    demo["runs"][1]["predicted_speedup"] = 3.0  # (the checked-in run predates the figure)
    ax = prediction_figure(demo).axes[0]
    assert [b.get_height() for b in ax.containers[0]] == [3.0]
    speed = demo["runs"][1]["samples_per_s"] / demo["runs"][0]["samples_per_s"]
    assert ax.containers[1][0].get_height() == pytest.approx(speed)
    assert "(x)" in ax.get_ylabel()
    assert main(["chart", "prediction", str(RESULTS / "plan.json"), "-o", str(tmp_path / "v.png")]
                ) == 0  # fmt: skip
    check_png(tmp_path / "v.png")


def test_a_file_of_another_kind_or_no_matplotlib_is_a_clear_error(
    planned: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    assert main(["chart", "kernels", str(planned)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hipress chart: not a `hipress bench kernels` result: it has no "
                          "'kernels'")  # fmt: skip
    assert main(["chart", "plan", str(tmp_path / "none.json")]) == 2
    assert "cannot read" in (err := capsys.readouterr().err) and "none.json" in err
    (tmp_path / "bad.json").write_text("{}")
    assert main(["chart", "plan", str(tmp_path / "bad.json")]) == 2
    assert f"hipress chart: {tmp_path / 'bad.json'}: " in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    assert main(["chart", "plan", str(planned), "-o", str(tmp_path / "p.png")]) == 2
    assert "pip install 'hipress[demo]'" in capsys.readouterr().err
    argv = ["plan", "--model", "mlp", "--workers", "4", "--bandwidth", "1gbit", "--png", "p.png"]
    assert main(argv) == 2  # before any work
    assert "argument --png: 'p.png' needs matplotlib" in capsys.readouterr().err
    assert not (tmp_path / "p.png").exists()
