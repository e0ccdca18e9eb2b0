"""``decode_sum``'s divisor on the C backend: a power-of-two divisor is applied as a multiply
by its reciprocal (exact where the reciprocal is a normal float), any other divisor as a divide;
either way bit-identical to the reference interpreter, down to subnormal results."""

from __future__ import annotations

import pytest
import torch
from test_native import same_values

from hipress.compll import load

# dense decodes (the tiled decode_sum) and one sparse one
NAMES = ("onebit", "int8", "tbq", "qsgd", "fp16", "bf16", "signsgd", "terngrad", "topk")
# powers of two with a normal reciprocal (multiplied), and others (divided): 2^127's
# reciprocal is subnormal, 2^-127 is itself subnormal
DIVISORS = (1.0, 4.0, 2.0**-126, 2.0**127, 2.0**-127, 3.0)


@pytest.mark.parametrize("name", NAMES)
def test_decode_sum_divisors_match_reference(name: str) -> None:
    n = 5003  # crosses tiles, ends in a partial one
    ref, cpu = load(name, backend="reference"), load(name, backend="cpu")
    gen = torch.Generator().manual_seed(3)
    payloads = []
    s_ref = ref.init_state(n, seed=5)
    for scale in (1.0, 1e-36, 3e37):  # ordinary, near-subnormal and near-maximal values
        x = torch.randn(n, generator=gen) * scale
        payloads.append(ref.encode(x, s_ref))
    for div in DIVISORS:
        want = ref.decode_sum(payloads, n, divide_by=div)
        got = cpu.decode_sum(payloads, n, divide_by=div)
        assert same_values(want, got), f"{name}: decode_sum / {div!r} differs from the reference"


@pytest.mark.parametrize("name", ["topk", "dgc", "graddrop"])  # (randomk: graddrop's path)
def test_sparse_decode_sum_over_many_tiles_and_threads(name: str) -> None:
    """The sparse sum, tile by tile on 2 threads (each thread's cursors start by a binary
    search): encoded payloads, and rotated ones with indices out of range, vs the reference."""
    from test_native import _sparse_payload

    n = 40001  # above the length run on one thread, 20 tiles, a partial last one
    ref, cpu = load(name, backend="reference"), load(name, backend="cpu")
    gen = torch.Generator().manual_seed(9)
    s_ref = ref.init_state(n, seed=2)
    payloads = [ref.encode(torch.randn(n, generator=gen), s_ref) for _ in range(3)]
    if name in ("topk", "dgc"):
        from hipress.compll.ir.payload import layout

        m = layout(ref.program, n)[0][-1].length // 2  # pairs: half the payload's bound
        for shift in (1, 350):
            idx = sorted(torch.randperm(n, generator=gen)[:m].tolist())
            idx = idx[shift:] + idx[:shift]  # ascending, rotated once
            idx[0], idx[-1] = -5, n + 3  # ignored
            val = torch.randn(m, generator=gen).tolist()
            payloads.append(_sparse_payload(ref, n, idx, val))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for div in (1.0, 4.0, 3.0):
            want = ref.decode_sum(payloads, n, divide_by=div)
            got = cpu.decode_sum(payloads, n, divide_by=div)
            assert same_values(want, got), f"{name}: sparse decode_sum / {div} differs"
    finally:
        torch.set_num_threads(threads)


# a 4-bit code: all 16 table entries, both halves of the AVX2 look-up
NIBBLES = """algorithm nibbles "a 4-bit code per element, decoded by a table of 16";
param scale: f64 in [1e-6, 1e6] = 0.25;
payload { q: uint<4>[n]; }
encode(g) {
    let q: uint<4>[n] = map(n, i => isfinite(g[i]) ? u8(min(max(g[i] * 40.0 + 8.0, 0.0), 15.0)) : 15);
    return concat(q);
}
decode(p) { return map(n, i => p.q[i] == 15 ? 0.0 / 0.0 : (f32(p.q[i]) - 8.0) * f32(scale)); }
"""


# a packed code half the output's length: the elements past it read 0 (no table: per element)
SHORT = """algorithm short "a packed code shorter than the output: the rest reads 0";
const k = n / 2;
payload { q: uint<2>[k]; }
encode(g) { let q: uint<2>[k] = map(k, i => g[i] < 0.0 ? 1 : 2); return concat(q); }
decode(p) { return map(n, i => p.q[i] == 1 ? -1.0 : (p.q[i] == 2 ? 1.0 : 0.5)); }
"""

TABULATED = ["onebit", "efsignsgd", "tbq", "terngrad", "nibbles", "short",  # a table per payload
             "signsgd", "blocksign", "qsgd", "signsgd-300",  # one per segment
             "signsgd-32", "qsgd-2bit",  # segments too short for tables; 2-bit codes
             "int8", "fp8-block-96", "fp8-block-16"]  # by segment runs; 16: element by element  # fmt: skip


@pytest.mark.parametrize("path", ["native", "no-avx512", "scalar"])
@pytest.mark.parametrize("name", TABULATED)
def test_tabulated_decode_sum_on_every_path(name: str, path: str, tmp_path) -> None:
    """Decodes of one packed value per element (and a value per segment) are summed by table
    look-up (a permute of 16 values with AVX-512, two of 8 with AVX2, a scalar loop), up to 4
    payloads of a tile in one pass, then the next ones onto their sum; others
    that read a value per segment run by run: the reference's values, with non-finite inputs
    among the payloads, at sizes around the vector widths, the tile and the segments (segments
    of 300 and 96 cross tiles; under 64 the runs give way to the element-by-element loop)."""
    from test_native import _on_path

    from hipress.compll import load_source
    from hipress.compll.ir.source import SourceFile

    if name in ("nibbles", "short"):
        text = NIBBLES if name == "nibbles" else SHORT
        ref = load_source(SourceFile(f"{name}.cll", text), backend="reference")
    elif name.startswith("signsgd-"):
        ref = load("signsgd", backend="reference", chunk=int(name.split("-")[1]))
    elif name == "qsgd-2bit":
        ref = load("qsgd", backend="reference", bits=2, bucket=100)
    elif name.startswith("fp8-block-"):
        from pathlib import Path

        from hipress.compll import load_file

        example = Path(__file__).parents[1] / "examples" / "fp8_block.cll"
        ref = load_file(str(example), backend="reference", block=int(name.rsplit("-", 1)[1]))
    else:
        ref = load(name, backend="reference")
    cpu = _on_path(ref, path, tmp_path)
    gen = torch.Generator().manual_seed(13)
    for n in (1, 7, 15, 17, 299, 2048 + 9, 2 * 2048 + 63):
        s_ref = ref.init_state(n, seed=6)
        payloads = []
        for r in range(6):
            x = torch.randn(n, generator=gen) * 0.02
            if r in (1, 5):
                x[(n // 2 + r) % n] = float("nan")
            payloads.append(ref.encode(x, s_ref))
        for div in (1.0, 4.0, 3.0):
            for k in (1, 2, 3, 4, 5, 6):  # the payloads of a tile are summed 4 at a time
                want = ref.decode_sum(payloads[:k], n, divide_by=div)
                got = cpu.decode_sum(payloads[:k], n, divide_by=div)
                assert same_values(want, got), f"{name} ({path}): {k} payloads / {div}, n={n}"
