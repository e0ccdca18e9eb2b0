"""The hipress CLI (run as a real subprocess where output matters)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hipress.cli import main
from hipress.compll import shipped_path


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hipress", *args], capture_output=True, text=True, check=False
    )


def test_check_ok_and_error(tmp_path: Path) -> None:
    r = _run("check", str(shipped_path("terngrad")))
    assert r.returncode == 0 and "ok: algorithm terngrad" in r.stdout
    bad = tmp_path / "bad.cll"
    bad.write_text(
        "algorithm x;\npayload { a: f32; }\nencode(g) { return concat(zz); }\n"
        "decode(p) { return map(n, i => p.a); }\n"
    )
    r = _run("check", str(bad))
    assert r.returncode == 1
    assert r.stderr.startswith(f"{bad}:3:27: error: unknown name `zz`")
    assert "Traceback" not in r.stderr
    r = _run("check", str(tmp_path / "missing.cll"))
    assert r.returncode == 1 and "cannot read" in r.stderr and "Traceback" not in r.stderr


def test_show_ir_and_layout(capsys) -> None:
    assert main(["show", str(shipped_path("terngrad")), "--ir", "--param", "bitwidth=4"]) == 0
    out = capsys.readouterr().out
    assert "param bitwidth = 4" in out and "q: uint<4>[n] = map(" in out
    assert main(["show", str(shipped_path("onebit")), "--layout", "-n", "9"]) == 0
    out = capsys.readouterr().out
    assert "payload layout for n=9: 24 bytes" in out


def test_algorithms_table(capsys) -> None:
    assert main(["algorithms"]) == 0
    out = capsys.readouterr().out
    assert "terngrad" in out and "2.000" in out


def test_bad_param_is_reported(capsys) -> None:
    assert main(["show", str(shipped_path("terngrad")), "--param", "bitwidth=3"]) == 1
    err = capsys.readouterr().err
    assert "`bitwidth` = 3 is outside its allowed values {1, 2, 4, 8}" in err


def test_bench_kernels_quick_writes_rooflines(tmp_path: Path) -> None:
    out = tmp_path / "k.json"
    r = _run(
        "bench", "kernels", "--sizes", "4K", "--algorithms", "onebit", "--reps", "1",
        "--no-torch", "--out", str(out),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "[hipress bench kernels] re-running with OMP_WAIT_POLICY=PASSIVE" in r.stderr
    data = json.loads(out.read_text())
    assert data["machine"]["omp_wait_policy"] == "PASSIVE"
    row = data["kernels"]["onebit"]["4096"]
    # onebit: gradient 4 B + its state (comp) read and written 8 B + payload (signs, scales) x 2
    assert 12.25 < row["encode_bytes_per_elem"] < 12.5
    assert row["encode"] > 0
    # the traffic at 3x the copy rate, capped by its 8 B of reads at the read-only rate
    by_traffic = 12 * row["copy"] / row["encode_bytes_per_elem"]
    assert abs(row["encode_roofline"] - min(by_traffic, 4 * row["read"] / 8)) < 1e-9


def test_shipped_names_counts_and_params_are_read_carefully(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["show", "terngrad", "--layout", "-n", "9"]) == 0  # a shipped name, not a path
    assert "payload layout for n=9: 24 bytes" in capsys.readouterr().out
    assert main(["show", "nosuch"]) == 1
    assert (
        "nosuch: no such file, nor a shipped algorithm (shipped: bf16," in capsys.readouterr().err
    )
    for n in ("-5", str(2**63), "1e3"):
        r = _run("show", "terngrad", "--layout", "-n", n)
        assert r.returncode == 2 and "argument -n:" in r.stderr and "Traceback" not in r.stderr
    for value, msg in [
        ("nan", "must be an integer (u32), got nan"),
        ("1e999", "must be an integer (u32), got inf"),
        ("10**400", "'10**400' is not a number or bool"),
    ]:
        r = _run("show", "terngrad", "--param", f"bitwidth={value}")
        assert r.returncode == 1 and msg in r.stderr and "Traceback" not in r.stderr


def test_build_renders_a_users_file(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    mine = tmp_path / "mine.cll"
    mine.write_text(
        shipped_path("terngrad").read_text().replace("algorithm terngrad", "algorithm mine")
    )
    out = tmp_path / "kernels"
    assert main(["build", str(mine), "--param", "bitwidth=4", "--out", str(out)]) == 0
    c, cu = out / "mine" / "mine.c", out / "mine" / "mine.cu"
    assert f"wrote {c}" in capsys.readouterr().out and cu.is_file()
    assert "hp_encode" in c.read_text() and "__global__" in cu.read_text()
    assert main(["build", "--param", "bitwidth=4"]) == 1  # the shipped set takes no parameters
