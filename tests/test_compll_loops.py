"""Bounded loops: ``for k in range(a, b)`` is unrolled when the program is specialised, so its
meaning is the reference interpreter's run of the unrolled code; the C and emulated CUDA
kernels of a loop-built program (the block Hadamard transform, its block size a parameter)
give the reference's bytes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hipress.compll import Algorithm, CllTypeError, SourceFile, load_source
from hipress.compll.backends.cuda.backend import CudaBackend
from hipress.compll.backends.cuda.emu import CxxToolchain, EmulatedRuntime
from hipress.compll.frontend import ast
from hipress.compll.frontend.check import check_source
from hipress.compll.frontend.parse import parse
from hipress.compll.ir import nodes as ir

HADAMARD = Path(__file__).parent / "golden" / "programs" / "hadamard.cll"


def _alg(body: str, backend: str = "reference", head: str = "", **params: object) -> Algorithm:
    text = (
        f"algorithm t;\n{head}\npayload {{ v: f32[n]; }}\nencode(g) {{ {body} }}\n"
        "decode(p) { return map(n, i => p.v[i]); }"
    )
    return load_source(SourceFile("t.cll", text), backend=backend, **params)


def _encode(alg: Algorithm, g: torch.Tensor) -> torch.Tensor:
    return alg.decode(alg.encode(g, alg.init_state(g.numel())), g.numel())


def test_for_parses_with_one_or_two_bounds() -> None:
    text = "algorithm t; payload { v: f32[n]; } encode(g) { for k in range(3) { } "
    text += "for k in range(1, 4) { } return concat(g); } decode(p) { return p.v; }"
    enc = next(d for d in parse(SourceFile("t.cll", text)).decls if isinstance(d, ast.EncodeDecl))
    a, b = enc.body.stmts[:2]
    assert isinstance(a, ast.For) and a.start is None and isinstance(a.stop, ast.Number)
    assert isinstance(b, ast.For) and isinstance(b.start, ast.Number)


def test_a_loop_carries_array_and_scalar_vars_in_order() -> None:
    body = """
        var h = map(n, i => g[i]);
        var c = 0.0;
        for s in range(k) {
            h = map(n, i => h[i] * 2.0 + f32(s));   // s is 0, 1, 2, ... in order
            c += 1.0;
        }
        return concat(map(n, i => {
            var acc = h[i];
            for j in range(1, 4) { acc = acc * 10.0 + f32(j); }
            return acc + c;
        }));"""
    g = torch.tensor([0.0, 1.0, -2.0])
    for k in (0, 1, 3):
        h = g.clone()
        for s in range(k):
            h = h * 2.0 + s
        want = ((h * 10 + 1) * 10 + 2) * 10 + 3 + k
        got = _encode(_alg(body, head="param k: i32 in [0, 5] = 1;", k=k), g)
        assert torch.equal(got, want), k


def test_the_loop_is_unrolled_into_the_ir() -> None:
    alg = _alg("var h = g; for s in range(2, 5) { h = map(n, i => h[i] + 1.0); } return concat(h);")
    maps = [op for op in alg.program.encode.ops if isinstance(op, ir.Map)]
    assert len(maps) == 3


def test_an_empty_range_runs_nothing() -> None:
    g = torch.tensor([1.0, 2.0])
    alg = _alg("var h = g; for s in range(3, 1) { h = map(n, i => 0.0); } return concat(h);")
    assert torch.equal(_encode(alg, g), g)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("for s in range(n) { } return concat(g);", "loop bound must be an integer constant"),
        ("for s in range(2.0) { } return concat(g);", "integer, got f32"),
        ("for s in range(5000) { } return concat(g);", "more than 4096 iterations"),
        ("for n in range(2) { } return concat(g);", "element count"),
        ("var h = g; if (true) { h = g; } return concat(h);", "cannot be assigned under `if`"),
        ("var h = g; h = map(n / 2, i => 0.0); return concat(h);", "does not match the declared"),
        ("var h = g; h += g; return concat(h);", "with `=` only"),
    ],
)
def test_loop_misuse_is_a_typed_error(body: str, message: str) -> None:
    with pytest.raises(CllTypeError, match=message):
        _alg(body)


def test_state_cannot_be_assigned_in_a_loop() -> None:
    text = """algorithm t; state c: f32; payload { v: f32[n]; }
encode(g) { for s in range(2) { c = 1.0; } return concat(g); }
decode(p) { return p.v; }"""
    with pytest.raises(CllTypeError, match="top level of encode") as info:
        check_source(SourceFile("t.cll", text))
    assert str(info.value).startswith("t.cll:2:")


# ---------------------------------------------------------------- the block Hadamard transform


def _hadamard(backend: str, log_block: int) -> Algorithm:
    return load_source(SourceFile.read(HADAMARD), backend=backend, log_block=log_block)


def _input(n: int) -> torch.Tensor:
    g = torch.randn(n, generator=torch.Generator().manual_seed(n))
    g[n // 2] = 30.0
    g[1::97] = -0.0
    return g


@pytest.mark.parametrize("log_block", [1, 3, 8])
def test_hadamard_kernels_equal_the_reference(log_block: int) -> None:
    ref, cpu = _hadamard("reference", log_block), _hadamard("cpu", log_block)
    for n in (1, 9, 1000003):
        g = _input(n)
        p1, p2 = ref.encode(g, ref.init_state(n)), cpu.encode(g, cpu.init_state(n))
        assert torch.equal(p1, p2), (log_block, n)
        d1, d2 = ref.decode(p1, n), cpu.decode(p1, n)
        assert torch.equal(d1, d2), (log_block, n)
        # a rotation spreads the outlier: 8 bits per element keep the error small
        assert (d1 - g).norm() <= 0.02 * g.norm(), (log_block, n)


@pytest.mark.skipif(CxxToolchain.detect() is None, reason="no C++ compiler")
@pytest.mark.parametrize("log_block", [1, 5])
def test_hadamard_emulated_cuda_equals_the_reference(log_block: int) -> None:
    ref = _hadamard("reference", log_block)
    runtime = EmulatedRuntime(blocks=3, shuffle=True, seed=11)
    emu = Algorithm(ref.program, CudaBackend(ref.program, runtime))  # type: ignore[arg-type]
    for n in (1, 9, 4099):
        g = _input(n)
        p1, p2 = ref.encode(g, ref.init_state(n)), emu.encode(g, emu.init_state(n))
        assert torch.equal(p1, p2.cpu()), (log_block, n)
        assert torch.equal(ref.decode(p1, n), emu.decode(p1, n).cpu()), (log_block, n)


def test_hadamard_nonfinite_input_decodes_to_nonfinite() -> None:
    ref = _hadamard("reference", 3)
    g = torch.ones(20)
    g[5] = float("nan")
    out = ref.decode(ref.encode(g, ref.init_state(20)), 20)
    assert not torch.isfinite(out[:8]).any() and torch.isfinite(out[8:]).all()
