"""Functions over arrays: a function that takes or returns arrays is inlined in host code (its
parallel operators run where it is called), so one definition serves encode and decode; the C
and emulated CUDA kernels give the reference's bytes; misuse is a typed error."""

from __future__ import annotations

import pytest
import torch

from hipress.compll import Algorithm, CllTypeError, SourceFile, load_source
from hipress.compll.backends.cuda.backend import CudaBackend
from hipress.compll.backends.cuda.emu import CxxToolchain, EmulatedRuntime

# a 3-row sketch-like estimate: the median of three arrays, written once, used on both sides
SKETCH = """algorithm med3 "median of three estimates";
const k = (n + 1) / 2;
payload { a: f32[k]; b: f32[k]; c: f32[k]; dot: f32; }

fn median3(a: f32[k], b: f32[k], c: f32[k]) -> f32[k] {
    return map(k, j => max(min(a[j], b[j]), min(max(a[j], b[j]), c[j])));
}

fn dot(a: f32[k], b: f32[k]) -> f32 {
    return f32(reduce(sum, k, j => f64(a[j]) * f64(b[j])));
}

fn fold(x: f32[n], r: i64) -> f32[k] {           // the pairs (2j, 2j + 1), scaled by row
    return map(k, j => (x[2 * j] + x[2 * j + 1]) * f32(r + 1));
}

encode(g) {
    let a = fold(g, 0);
    let b = fold(g, 1);
    let c = map(k, j => -a[j]);
    let m = median3(a, b, c);
    return concat(a, b, c, dot(m, m));
}

decode(p) {
    let m = median3(p.a, p.b, p.c);
    return map(n, i => m[i / 2] * 0.5 + p.dot * 0.0);
}
"""


def _pair() -> tuple[Algorithm, Algorithm]:
    src = SourceFile("med3.cll", SKETCH)
    return load_source(src, backend="reference"), load_source(src, backend="cpu")


def _input(n: int) -> torch.Tensor:
    g = torch.randint(-64, 64, (n,), generator=torch.Generator().manual_seed(n)).float() / 4
    if n > 4099:
        g[3] = float("nan")  # every decoded value is then NaN (through `dot`)
    return g


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


def test_array_functions_compute_what_they_say() -> None:
    ref, _ = _pair()
    g = torch.tensor([1.0, 2.0, -3.0, 1.0])
    p = ref.encode(g, ref.init_state(4))
    out = ref.decode(p, 4)
    # pairs: 3 and -2; rows 0, 1 and negated row 0; medians 3 and -2 (then halved per element)
    assert torch.equal(out, torch.tensor([1.5, 1.5, -1.0, -1.0]))


def test_array_functions_on_c_equal_the_reference() -> None:
    ref, cpu = _pair()
    for n in (1, 9, 1000003):
        g = _input(n)
        p1, p2 = ref.encode(g, ref.init_state(n)), cpu.encode(g, cpu.init_state(n))
        assert torch.equal(p1, p2), n
        assert _same(ref.decode(p1, n), cpu.decode(p1, n)), n


@pytest.mark.skipif(CxxToolchain.detect() is None, reason="no C++ compiler")
def test_array_functions_on_emulated_cuda_equal_the_reference() -> None:
    ref, _ = _pair()
    emu = Algorithm(ref.program, CudaBackend(ref.program, EmulatedRuntime(blocks=3, shuffle=True)))  # type: ignore[arg-type]
    for n in (1, 9, 4099):
        g = _input(n)
        p1, p2 = ref.encode(g, ref.init_state(n)), emu.encode(g, emu.init_state(n))
        assert torch.equal(p1, p2.cpu()), n
        assert _same(ref.decode(p1, n), emu.decode(p1, n).cpu()), n


_HEAD = "fn twice(a: f32[n]) -> f32[n] { return map(n, i => a[i] * 2.0); }\n"
_HEAD += "fn total(a: f32[n]) -> f32 { return reduce(sum, a); }\n"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("return concat(map(n, i => twice(g)[i]));", "not inside a lambda"),
        ("let h = twice(map(n / 2, i => 0.0)); return concat(h);", r"is f32\[n\], got f32"),
        ("let h = twice(1.0); return concat(h);", "got a scalar"),
        ("let x = twice(g) + 1.0; return concat(g);", "returns an array; bind it"),
        ("let x = total(g); return concat(map(n, i => g[i] + x));", None),
    ],
)
def test_array_function_misuse_is_a_typed_error(body: str, message: str | None) -> None:
    text = f"algorithm t;\n{_HEAD}payload {{ v: f32[n]; }}\nencode(g) {{ {body} }}\n"
    text += "decode(p) { return p.v; }"
    src = SourceFile("t.cll", text)
    if message is None:
        load_source(src, backend="reference")  # a scalar result from arrays is fine
        return
    with pytest.raises(CllTypeError, match=message) as info:
        load_source(src, backend="reference")
    assert str(info.value).startswith("t.cll:")


def test_an_uncalled_array_function_is_checked() -> None:
    text = """algorithm t;
fn bad(a: f32[n]) -> f32[n] { return map(n, i => a[i] + true); }
payload { v: f32[n]; }
encode(g) { return concat(g); }
decode(p) { return p.v; }"""
    with pytest.raises(CllTypeError, match="mismatched types"):
        load_source(SourceFile("t.cll", text), backend="reference")
