"""Dead-code removal (hipress.compll.ir.prune): an unused value is not computed, also when
parameter folding removed its only use; what is used, and every state store, stays."""

from __future__ import annotations

import torch

from hipress.compll import SourceFile, load_source
from hipress.compll.frontend.check import check_source
from hipress.compll.ir import nodes as ir

_SRC = """
algorithm dead "a copy with values it may not use";
param use: bool = false;
state steps: i64;
payload { v: f32[n]; }
encode(g) {
    let s = segreduce(sum, 1, n, i => g[i]);          // read only when `use`
    let unused = segreduce(max, 4, n, i => abs(g[i])); // read by nothing
    let r = reduce(sum, n, i => f64(g[i]));            // read only by `r2`, unused
    let r2 = r * 2.0;
    steps = steps + 1;                                 // kept: state
    return concat(map(n, i => {
        let dead = g[i] * 3.0;                         // a lambda's unused let
        return use ? s[i] : g[i];
    }));
}
decode(p) {
    let t = map(n, i => p.v[i] * 2.0);
    return map(n, i => p.v[i]);
}
"""


def _program(**params: object) -> ir.Program:
    return check_source(SourceFile("dead.cll", _SRC), params)


def test_unused_values_are_not_in_the_program() -> None:
    prog = _program()
    enc = prog.encode.ops
    # the new value of `steps` (a let) and its store, then the sent map
    assert [type(op).__name__ for op in enc] == ["Let", "StoreState", "Map"]
    (lam,) = [op.fn for op in enc if isinstance(op, ir.Map)]
    assert lam.lets == ()
    assert [type(op).__name__ for op in prog.decode.ops] == ["Map"]


def test_a_value_used_after_folding_stays() -> None:
    prog = _program(use=True)
    names = [op.name for op in prog.encode.ops if isinstance(op, ir.SegReduce)]
    assert names == ["s"]


def test_pruned_program_computes_the_same() -> None:
    g = torch.randn(37)
    for use in (False, True):
        alg = load_source(SourceFile("dead.cll", _SRC), backend="reference", use=use)
        st = alg.init_state(g.numel())
        out = alg.decode(alg.encode(g, st), g.numel())
        assert torch.equal(out, g)
        assert int(st.tensors["steps"]) == 1


def test_a_shipped_algorithm_loses_its_unused_segment_sum() -> None:
    # qsgd with its default max norm never reads the L2 sums it declares
    from hipress.compll import load

    ops = load("qsgd", backend="reference").program.encode.ops
    assert [op.name for op in ops if isinstance(op, ir.SegReduce)] == ["mx"]
    ops = load("qsgd", backend="reference", maxnorm=False).program.encode.ops
    assert [op.name for op in ops if isinstance(op, ir.SegReduce)] == ["ss"]
