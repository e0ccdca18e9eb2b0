"""Maps deferred to a filter (lower.FilterFusion): which maps the planner defers, and the C
kernel that stores them in the filter's own pass equals the reference, on every path (the
fused pass, the run-time fallback when a rotation does not cover every index once, a guarded
filter, state that cannot be written in place, and maps read before the filter)."""

from __future__ import annotations

import pytest
import torch
from test_native import run_both

from hipress.compll import load, load_source
from hipress.compll.backends.cache import Toolchain
from hipress.compll.backends.targets import render
from hipress.compll.ir.source import SourceFile
from hipress.compll.lower.lower import lower

NAN, INF = float("nan"), float("inf")
SIZES = (0, 1, 2, 7, 9, 100, 2049, 16384 + 9, 50001)
needs_cc = pytest.mark.skipif(Toolchain.detect() is None, reason="no C compiler")

# the filter reads c rotated by an offset taken from the input (in range, negative, past n);
# c is also read before the filter (a gathered sort) and after it (a gather and a reduction)
ROTATED = """
algorithm t_rot "a filter that stores the state it reads, rotated";
state r: f32[n];
payload { k: i64; q: i32[min(n, 7)]; v: f32[min(n, 7)]; s: f32[min(n, 3)]; m: f32; }
encode(g) {
    let c = map(n, i => g[i] + r[i] * 0.5);
    let s = sort(min(n, 3), j => abs(c[(j * 7 + 1) % max(n, 1)]));
    let off = n > 0 ? i64(clamp(g[0], -1000000.0, 1000000.0)) : 0;
    let (p, k) = filter(min(n, 7), n, j => c[(j + off) % n] > 0.25);
    let q = map(min(n, 7), t => p[t]);
    let v = map(min(n, 7), t => t < k ? c[(i64(p[t]) + off) % n] : 0.0);
    let m = reduce(max, n, i => k >= 0 ? c[i] : 0.0);
    r = c;
    return concat(k, q, v, s, m);
}
decode(p) { return map(n, i => p.m); }
"""

# read at the filter's own index: two maps (one bool) through a virtual helper, no check needed
PLAIN = """
algorithm t_plain "a filter that stores two states at its own index";
state a: f32[n];
state b: bool[n];
payload { k: i64; q: i32[min(n, 9)]; }
encode(g) {
    let w = map(n, i => b[i] && a[i] > -1.0);
    let na = map(n, i => w[i] ? a[i] * 0.5 + g[i] : g[i]);
    let nb = map(n, i => na[i] > 0.0 && w[i]);
    let (p, k) = filter(min(n, 9), n, j => nb[j] || na[j] < -2.0);
    a = na;
    b = nb;
    return concat(k, p);
}
decode(p) { return map(n, i => f32(p.k)); }
"""

# d reads c at another index, and could run beside the filter: the filter runs after it
BESIDE = """
algorithm t_beside "a map read beside its filter";
state r: f32[n];
payload { k: i64; d: f32[n]; }
encode(g) {
    let c = map(n, i => g[i] + r[i]);
    let t = reduce(max, n, i => g[i]);
    let d = map(n, i => c[(i + 1) % n] + t);
    let (p, k) = filter(min(n, 5), n, j => c[j] > t * 0.5);
    r = c;
    return concat(k, d);
}
decode(p) { return map(n, i => p.d[i]); }
"""

# the filter reads the old state itself at another index: c goes to the workspace, then state
NOT_IN_PLACE = """
algorithm t_ws "a filter that reads the old state elsewhere";
state r: f32[n];
payload { k: i64; q: i32[min(n, 5)]; }
encode(g) {
    let c = map(n, i => g[i] + r[i]);
    let (p, k) = filter(min(n, 5), n, j => c[j] > r[(j + 1) % n]);
    r = c;
    return concat(k, p);
}
decode(p) { return map(n, i => f32(p.k)); }
"""

# a loop-invariant guard (every other step): the filter's pass is skipped, c is still stored
GUARDED = """
algorithm t_guarded "a guarded filter with a deferred map";
state r: f32[n];
state on: bool;
payload { k: i64; q: i32[min(n, 5)]; }
encode(g) {
    let c = map(n, i => g[i] + r[i] * 0.5);
    let (p, k) = filter(min(n, 5), n, j => on && c[j] > 0.0);
    r = c;
    on = !on;
    return concat(k, p);
}
decode(p) { return map(n, i => f32(p.k)); }
"""

PROGRAMS = {"rotated": ROTATED, "plain": PLAIN, "beside": BESIDE, "ws": NOT_IN_PLACE,
            "guarded": GUARDED}  # fmt: skip


def _prog(text: str):
    return load_source(SourceFile("t.cll", text), backend="reference").program


def _deferred(text: str) -> list[tuple[str, list[str]]]:
    plan = lower(_prog(text), "encode")
    return [(type(f.special.op).__name__, [it.op.name for it in f.loop.items])
            for f in plan.filter_fusions]  # fmt: skip


def test_the_planner_defers_what_the_filter_reads_at_its_index() -> None:
    assert _deferred(ROTATED) == [("Filter", ["c"])]
    assert _deferred(PLAIN) == [("Filter", ["na", "nb"])]
    assert _deferred(GUARDED) == [("Filter", ["c"])]
    assert _deferred(NOT_IN_PLACE) == [("Filter", ["c"])]
    assert _deferred(BESIDE) == [("Filter", ["c"])]
    beside = lower(_prog(BESIDE), "encode")
    (ff,) = beside.filter_fusions
    assert beside.levels["d"] < ff.level  # d recomputes c before the filter stores it
    plain = lower(_prog(PLAIN), "encode")
    assert "w" not in plain.homes  # the helper is computed in registers, not stored
    assert plain.homes["na"].kind == "state" and plain.homes["nb"].kind == "state"
    ws = lower(_prog(NOT_IN_PLACE), "encode")
    assert ws.homes["c"].kind == "ws"  # the old state is still read: copied at the end
    rot = lower(_prog(ROTATED), "encode")
    (ff,) = rot.filter_fusions
    assert ff.offset is not None and rot.homes["c"].kind == "state"
    # the sort before the filter recomputes c; the gather after it reads the stored c
    sort_lv = next(st.level for st in rot.steps for sp in st.specials
                   if type(sp.op).__name__ == "Sort")  # fmt: skip
    assert sort_lv < ff.level and rot.recomputed("c", sort_lv)
    assert not rot.recomputed("c", ff.level + 1)


@pytest.mark.parametrize("name", ["graddrop", "dgc"])
def test_the_sampled_sparsifiers_make_one_pass(name: str) -> None:
    prog = load(name, backend="reference").program
    plan = lower(prog, "encode")
    (ff,) = plan.filter_fusions
    stored = sorted(it.op.name for it in ff.loop.items)
    assert stored == (["c"] if name == "graddrop" else ["un", "v"])
    n = repr(ff.loop.length)
    others = [it.op for st in plan.steps for lp in st.loops
              if repr(lp.length) == n and lp is not ff.loop for it in lp.items]  # fmt: skip
    # nothing else runs over all n elements, but the look for NaN/Inf past a full compaction
    # (a guarded `any`: skipped unless the compaction filled up)
    assert [(type(op).__name__, getattr(op, "op", None)) for op in others] == [("Reduce", "any")]
    assert all(a.origin != "map" or a.length != ff.loop.length for a in plan.ws)
    c = render(prog, "c")
    assert f"stores {', '.join(stored)}" in c and "every index once" in c


def _inputs(n: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(n)
    x = torch.randint(-300, 300, (n,), generator=gen).float() / 64
    out = {"plain": x}
    if n:
        for name, first in (("neg", -3.0), ("past", float(n + 5)), ("end", float(n - 1))):
            y = x.clone()
            y[0] = first
            out[name] = y
        y = x.clone()
        y[1::97] = NAN
        y[2::131] = -INF
        y[3::7] = -0.0
        out["nonfinite"] = y
    return out


@needs_cc
@pytest.mark.parametrize("prog", sorted(PROGRAMS))
def test_deferred_maps_equal_reference(prog: str) -> None:
    src = SourceFile(f"{prog}.cll", PROGRAMS[prog])
    ref, cpu = load_source(src, backend="reference"), load_source(src, backend="cpu")
    for n in SIZES:
        for x in _inputs(n).values():
            run_both(ref, cpu, x, steps=3)
            # the gradient's NaN/Inf flag, from the fused pass or the fallback's own scan
            flag = cpu.encode_checked(x, cpu.init_state(n))[1]
            assert flag == (not bool(torch.isfinite(x).all())), (prog, n)


@needs_cc
@pytest.mark.parametrize("name", ["graddrop", "dgc"])
def test_sparsifiers_fused_pass_equals_reference_when_the_bound_fills(name: str) -> None:
    # every element passes: each thread's compaction fills up early and the pass goes on
    # storing the state to the end
    params = {"s_percent": 0.01} if name == "dgc" else {"drop_ratio": 0.99}
    ref, cpu = load(name, backend="reference", **params), load(name, backend="cpu", **params)
    for n in (16384 + 9, 100003):
        x = torch.where(torch.arange(n) % 3 == 0, -1.0, 1.0)
        run_both(ref, cpu, x, steps=3)


@pytest.mark.parametrize("prog", sorted(PROGRAMS))
def test_cuda_runs_the_plain_steps_and_compiles(prog: str) -> None:
    cuda = pytest.importorskip("hipress.compll.backends.cuda.nvrtc")
    try:
        cuda._nvrtc()
    except cuda.CudaUnavailable:
        pytest.skip("NVRTC not installed")
    p = _prog(PROGRAMS[prog])
    assert cuda.compile_check(p, ("sm_80",))["sm_80"] > 0
