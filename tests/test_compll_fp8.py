"""The fp8 storage types ``f8e4m3`` and ``f8e5m2`` convert exactly as torch's
``float8_e4m3fn`` and ``float8_e5m2`` do (round to nearest even; e4m3 saturates at +-448, inf
included; e5m2 overflows to inf from 61440; NaN keeps its sign until the payload stores it as
0x7f), on the reference, C and emulated CUDA: every fp8 code read back, and f32 bit patterns
sampled across all 2^32 plus every rounding boundary. Misuse diagnostics are goldens
(tests/golden/errors/fp8_*.cll)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hipress.compll import Algorithm, SourceFile, load_source
from hipress.compll.backends.cuda.backend import CudaBackend
from hipress.compll.backends.cuda.emu import CxxToolchain, EmulatedRuntime

PROG = """algorithm fp8;
payload { a: f8e4m3[n]; b: f8e5m2[n]; }
encode(g) { return concat(map(n, i => f8e4m3(g[i])), map(n, i => f8e5m2(g[i]))); }
decode(p) { return map(n, i => i % 2 == 0 ? f32(p.a[i / 2]) : f32(p.b[i / 2])); }
"""
TORCH = (torch.float8_e4m3fn, torch.float8_e5m2)


@pytest.fixture(scope="module")
def algs() -> tuple[Algorithm, ...]:
    src = SourceFile("fp8.cll", PROG)
    ref = load_source(src, backend="reference")
    cpu = load_source(src, backend="cpu")
    if CxxToolchain.detect() is None:
        return ref, cpu
    emu = Algorithm(ref.program, CudaBackend(ref.program, EmulatedRuntime(blocks=3, shuffle=True)))  # type: ignore[arg-type]
    return ref, cpu, emu


def _torch_codes(x: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
    """torch's fp8 bytes of ``x``, every NaN as the payload stores it (0x7f)."""
    codes = x.to(dt).view(torch.uint8).clone()
    codes[torch.isnan(x)] = 0x7F
    return codes


def _patterns() -> torch.Tensor:
    """f32 values: a bit pattern every 4093 across all 2^32, and 9 patterns around each value
    of an fp8 code and each midpoint between neighbouring codes (where rounding decides)."""
    sweep = torch.arange(0, 1 << 32, 4093, dtype=torch.int64)
    points = []
    for dt in TORCH:
        v = torch.arange(256, dtype=torch.uint8).view(dt).to(torch.float64)
        v = v[torch.isfinite(v)].unique()
        mids = (v[1:] + v[:-1]) / 2
        for x in (v, mids, torch.tensor([448.0, 464.0, 480.0, 57344.0, 61440.0, 65536.0])):
            bits = x.to(torch.float32).view(torch.int32).to(torch.int64) & 0xFFFFFFFF
            points.append((bits[:, None] + torch.arange(-4, 5)).reshape(-1))
    allbits = torch.cat([sweep, *points]) & 0xFFFFFFFF
    return (
        allbits.to(torch.int64)
        .sub((allbits >= 1 << 31).to(torch.int64) << 32)
        .to(torch.int32)
        .view(torch.float32)
    )


def test_f32_to_fp8_matches_torch(algs: tuple[Algorithm, ...]) -> None:
    g = _patterns()
    n = g.numel()
    want = torch.cat([_torch_codes(g, dt) for dt in TORCH])
    off = (n + 7) // 8 * 8
    for alg in algs:
        p = alg.encode(g, alg.init_state(n)).cpu()
        got = torch.cat([p[:n], p[off : off + n]])
        bad = (got != want).nonzero()
        assert bad.numel() == 0, (alg, g[bad[0] % n].item(), got[bad[0]], want[bad[0]])


def test_every_fp8_code_reads_back_exactly(algs: tuple[Algorithm, ...]) -> None:
    codes = torch.arange(256, dtype=torch.uint8)
    payload = torch.cat([codes, codes, codes, codes])  # n = 512: a at 0, b at 512
    want = torch.stack([codes.view(dt).to(torch.float32) for dt in TORCH], dim=1).reshape(-1)
    for alg in algs:
        out = alg.decode(payload, 512).cpu()  # a[0], b[0], a[1], b[1], ...
        assert torch.equal(torch.isnan(out), torch.isnan(want))
        ok = ~torch.isnan(want)
        assert torch.equal(out[ok].view(torch.int32), want[ok].view(torch.int32))


def test_block_example_equals_the_hand_made_conversion() -> None:
    """examples/fp8_block.cll and its hand-made twin send the same bytes: torch's E4M3 codes
    of each element divided by its block's scale."""
    root = Path(__file__).parent.parent / "examples"
    algs = [
        load_source(SourceFile(f.name, f.read_text()), backend="reference")
        for f in (root / "fp8_block.cll", root / "fp8_block_handmade.cll")
    ]
    gen = torch.Generator().manual_seed(0)
    g = torch.randn(1000, generator=gen) * torch.logspace(-8, 3, 1000)
    g[[5, 130]] = torch.tensor([-0.0, 0.0])
    built, hand = (a.encode(g, a.init_state(1000)) for a in algs)
    assert torch.equal(built, hand)
    scale = built[:32].view(torch.float32)  # 8 blocks of 128 (the last shorter)
    want = (g / scale.repeat_interleave(128)[:1000]).to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(built[32:1032], want)
    assert torch.equal(algs[0].decode(built, 1000), algs[1].decode(hand, 1000))
