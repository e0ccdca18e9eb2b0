"""A cached library is used only if it is the kernel of its key: two libraries swapped in the
cache with digest records rewritten to match (as the same user could) are built again, not run
(they crashed the process with SIGSEGV/SIGABRT)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from hipress.compll import load_source
from hipress.compll.backends.cache import RECORD
from hipress.compll.ir.source import SourceFile

PLAIN = """algorithm plain "a scaled copy";
payload { q: f32[n]; }
encode(g) { return concat(map(n, i => g[i] * 2.0)); }
decode(p) { return map(n, i => p.q[i] * 0.5); }
"""
# another layout: a state array and a scalar field, so that either kernel called with the
# other's arguments reads or writes where it must not
STATEFUL = """algorithm stateful "int8 with a residual";
state r: f32[n];
payload { s: f32; q: i8[n]; }
encode(g) {
    let c = map(n, i => g[i] + r[i]);
    let s = reduce(max, n, i => abs(c[i])) / 127.0 + 1e-30;
    let q = map(n, i => i8(clamp(round(c[i] / s), -127.0, 127.0)));
    r = map(n, i => c[i] - f32(q[i]) * s);
    return concat(s, q);
}
decode(p) { return map(n, i => f32(p.q[i]) * p.s); }
"""

CHILD = textwrap.dedent(
    """
    import sys, torch
    from hipress.compll import load_source
    from hipress.compll.ir.source import SourceFile
    for name, text in ((sys.argv[1], sys.argv[2]), (sys.argv[3], sys.argv[4])):
        cpu = load_source(SourceFile(name, text), backend="cpu")
        ref = load_source(SourceFile(name, text), backend="reference")
        x = torch.linspace(-3, 5, 1000)
        got = cpu.decode(cpu.encode(x, cpu.init_state(1000)), 1000)
        want = ref.decode(ref.encode(x, ref.init_state(1000)), 1000)
        assert torch.equal(got, want), name
    print("ok")
    """
)


def _swap(a: Path, b: Path) -> None:
    """Exchange two libraries and write digest records that match their new bytes. Each is
    replaced by a new file (rename), never rewritten in place: this process has both mapped,
    and rewriting a mapped library's pages corrupts its code here (a crash at exit)."""
    da, db = a.read_bytes(), b.read_bytes()
    for path, data in ((a, db), (b, da)):
        tmp = path.with_name(path.name + ".swap")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        digest = hashlib.sha256(data).hexdigest()
        record = path.with_name(path.name + RECORD)
        record.write_text(f"sha256={digest} size={len(data)} name={path.name}\n")


def test_swapped_libraries_are_built_again_not_run(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("HIPRESS_CACHE_DIR", str(tmp_path / "cache"))
    env = dict(os.environ)
    paths = [
        load_source(SourceFile(f"{n}.cll", t), backend="cpu").backend.path
        for n, t in (("plain", PLAIN), ("stateful", STATEFUL))
    ]
    _swap(*paths)
    args = ["plain.cll", PLAIN, "stateful.cll", STATEFUL]
    res = subprocess.run(
        [sys.executable, "-c", CHILD, *args], env=env, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert res.returncode == 0, f"status {res.returncode}\n{res.stderr[-2000:]}"
    assert res.stdout.strip() == "ok"
    assert res.stderr.count("is not the kernel of its key") == 2, res.stderr
