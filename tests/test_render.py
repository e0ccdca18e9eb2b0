"""Rendering: deterministic, fused as designed, and the checked-in generated/ sources are fresh."""

from __future__ import annotations

import pytest

from hipress.cli.compll import GENERATED, check_generated, render_all
from hipress.compll import algorithms, load, load_source
from hipress.compll.backends.render import BANNER, environment
from hipress.compll.backends.targets import render
from hipress.compll.ir.source import SourceFile
from hipress.compll.lower.lower import lower


def _prog(text: str):
    return load_source(SourceFile("t.cll", text), backend="reference").program


def _loops(plan, over_n: bool = True):
    return [lp for st in plan.steps for lp in st.loops]


@pytest.mark.parametrize("target", ["c", "cuda"])
def test_rendering_is_deterministic(target: str) -> None:
    prog = load("terngrad", backend="reference").program
    a, b = render(prog, target), render(prog, target)
    assert a == b and BANNER in a and prog.digest()[:16] in a


def test_one_jinja_environment_with_strict_undefined() -> None:
    import jinja2

    env = environment()
    assert env is environment() and env.undefined is jinja2.StrictUndefined
    with pytest.raises(jinja2.UndefinedError):
        env.get_template("c_loop.c.j2").render()


def test_elementwise_chains_fuse_into_one_pass() -> None:
    prog = _prog("""
    algorithm chain "a chain of maps"; state r: f32[n];
    payload { q: uint<2>[n]; }
    encode(g) {
        let a = map(n, i => g[i] * 2.0);
        let b = map(n, i => a[i] + r[i]);
        let c = map(n, i => abs(b[i]) - 1.0);
        let q: uint<2>[n] = map(n, i => c[i] > 0.0 ? 1 : 0);
        r = map(n, i => c[i] * 0.5);
        return concat(q);
    }
    decode(p) { return map(n, i => f32(p.q[i])); }
    """)
    plan = lower(prog, "encode")
    assert len(_loops(plan)) == 1  # one pass: pack + in-place state update
    assert plan.ws == ()  # nothing materialised
    assert plan.homes["r.1"].kind == "state"  # state updated in place


def test_reduction_feeding_a_map_costs_two_passes() -> None:
    # (onebit, efsignsgd and tbq write their error feedback in the pass that reduces: where it
    # depends on the reduction, they keep the compensated gradient and apply it a step later)
    for name, passes in (("onebit", 1), ("efsignsgd", 1), ("terngrad", 2), ("tbq", 1),
                         ("signsgd", 1), ("fp16", 1), ("bf16", 1)):  # fmt: skip
        plan = lower(load(name, backend="reference").program, "encode")
        n_loops = [
            lp
            for lp in _loops(plan)
            if repr(lp.length) == "Ref(name='n', dtype=DType(name='i64', kind='int', bits=64))"
        ]
        assert len(n_loops) == passes, name
        assert not [a for a in plan.ws if a.origin == "map"], name


def test_segment_reduction_fuses_with_its_readers() -> None:
    plan = lower(load("int8", backend="reference").program, "encode")
    (fu,) = plan.fusions
    assert [it.op.name for lp in fu.seg_loops for it in lp.items] == ["scale"]
    assert [it.op.name for lp in fu.elem_loops for it in lp.items] == ["q"]
    prog = load("int8", backend="reference").program
    assert "fused with scale, q" in render(prog, "c")
    assert "segreduce" in render(prog, "cuda")  # other targets run the plain steps
    # qsgd: a segment length known only at run time (and random numbers, packed output)
    assert lower(load("qsgd", backend="reference").program, "encode").fusions == ()


@pytest.mark.parametrize(
    "read",
    ["amax[i / 8 + 1]",  # the next segment: not computed yet in this block
     "amax[i / 4]",  # another segment length
     "amax[(i + 8) / 8]",
     "amax[0]"],
)  # fmt: skip
def test_segment_reduction_read_elsewhere_is_not_fused(read: str) -> None:
    prog = _prog(f"""
    algorithm t "reads outside the segment"; payload {{ q: f32[n]; }}
    encode(g) {{
        let amax = segreduce(absmax, 8, g);
        return concat(map(n, i => g[i] / {read}));
    }}
    decode(p) {{ return map(n, i => p.q[i]); }}
    """)
    assert lower(prog, "encode").fusions == ()
    ok = _prog("""
    algorithm t "reads the own segment"; payload { q: f32[n]; }
    encode(g) {
        let amax = segreduce(absmax, 8, g);
        return concat(map(n, i => g[i] / amax[i / 8]));
    }
    decode(p) { return map(n, i => p.q[i]); }
    """)
    assert len(lower(ok, "encode").fusions) == 1


def test_state_that_is_still_read_later_is_not_updated_in_place() -> None:
    prog = _prog("""
    algorithm late "old state read after the update"; state r: f32[n];
    payload { s: f32; v: f32[n]; }
    encode(g) {
        let nr = map(n, i => r[i] + g[i]);
        let t = reduce(sum, n, i => nr[i] * 2.0);
        let v = map(n, i => r[(i + 1) % n] + t);
        r = nr;
        return concat(t, v);
    }
    decode(p) { return map(n, i => p.v[i]); }
    """)
    plan = lower(prog, "encode")
    assert plan.homes["nr"].kind == "ws"  # copied to the state at the end instead


def test_generated_sources_are_fresh() -> None:
    """`hipress build` output is checked in; regenerate with `hipress build` when this fails."""
    stale = check_generated(GENERATED)
    assert stale == [], f"stale generated sources: {stale}; run `hipress build`"


def test_render_all_covers_every_algorithm_and_target() -> None:
    files = render_all()
    for name in algorithms():
        assert f"{name}/{name}.c" in files and f"{name}/{name}.cu" in files
    assert "MANIFEST.json" in files


def test_the_cli_table_holds_every_target() -> None:
    from hipress.compll.backends.render import TARGETS
    from hipress.compll.backends.targets import TABLE

    assert tuple(TABLE) == TARGETS


def _protocol_members(proto: type) -> set[str]:
    out: set[str] = set()
    for cls in proto.__mro__:
        if getattr(cls, "_is_protocol", False) and cls.__module__ != "typing":
            out |= set(getattr(cls, "__annotations__", {}))
            out |= {k for k, v in vars(cls).items() if callable(v) and not k.startswith("_")}
    return out


def test_stage_rules_ask_only_what_their_renderer_has() -> None:
    """The protocols the stage rules are written against (so they need not import their
    renderer) name only members the renderers have."""
    from hipress.compll.backends.c.render import CFunction
    from hipress.compll.backends.c.stages import CRenderer
    from hipress.compll.backends.cuda.render import CudaFunction
    from hipress.compll.backends.cuda.stages import CudaRenderer

    prog = load("topk", backend="reference").program
    plan = lower(prog, "encode")
    for proto, cls in ((CRenderer, CFunction), (CudaRenderer, CudaFunction)):
        f = cls(environment(), prog, plan, "hp_encode")
        members = _protocol_members(proto)
        assert {"env", "length", "loop" if cls is CFunction else "piece"} <= members
        assert [m for m in sorted(members) if not hasattr(f, m)] == [], cls.__name__
