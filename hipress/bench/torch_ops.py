"""The kernel benchmark's baselines: each shipped algorithm's work done with plain torch ops
(default parameters, without the C kernels' NaN/Inf handling). The sparsifiers send the same
fraction as the kernels (dgc 0.1%, the others 1%); dgc's includes its momentum correction and
masking."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["Fn", "torch_versions"]

Fn = Callable[[], object]


def _pack(v: torch.Tensor, bits: int) -> torch.Tensor:
    per = 8 // bits
    sh = torch.arange(per, dtype=torch.int32) * bits
    return (v.view(-1, per).to(torch.int32) << sh).sum(1).to(torch.uint8)


def _unpack(b: torch.Tensor, bits: int) -> torch.Tensor:
    per = 8 // bits
    sh = torch.arange(per, dtype=torch.int32) * bits
    return ((b.to(torch.int32).view(-1, 1) >> sh) & ((1 << bits) - 1)).view(-1)


def torch_versions(name: str, g: torch.Tensor) -> tuple[Fn, Fn]:
    """(encode, decode) closures doing the algorithm's work with torch ops (n % 512 == 0), on
    ``g``'s device."""
    with torch.device(g.device):
        enc, dec = _torch_versions(name, g)

    def on_device(fn: Fn) -> Fn:
        def call() -> object:
            with torch.device(g.device):
                return fn()

        return call

    return on_device(enc), on_device(dec)


def _torch_versions(name: str, g: torch.Tensor) -> tuple[Fn, Fn]:
    n = g.numel()
    r = torch.zeros(n)
    out = torch.empty(n)
    if name in ("onebit", "efsignsgd", "signsgd"):
        return _signs(name, g, r, out)
    if name in ("fp16", "bf16", "int8"):
        return _casts(name, g, out)
    if name in ("terngrad", "qsgd", "tbq"):
        return _quantisers(name, g, r, out)
    return _sparsifiers(name, g, r, out)


SIGN_CHUNK = 256  # signsgd's default chunk


def _signs(name: str, g: torch.Tensor, r: torch.Tensor, out: torch.Tensor) -> tuple[Fn, Fn]:
    n = g.numel()
    st: dict[str, Any] = {}

    def enc() -> None:
        c = g + r if name != "signsgd" else g
        neg = c < 0
        if name == "onebit":
            pos = torch.where(neg, 0.0, c).double().sum() / max(1, int((~neg).sum()))
            ng = torch.where(neg, c, 0.0).double().sum() / max(1, int(neg.sum()))
            st["s"], st["p"], st["q"] = _pack(neg, 1), float(pos), float(ng)
            r.copy_(c - torch.where(neg, ng, pos).float())
        elif name == "signsgd":  # a mean-magnitude scale per chunk (the last one shorter)
            a = torch.nn.functional.pad(c.abs(), (0, -n % SIGN_CHUNK)).view(-1, SIGN_CHUNK)
            counts = torch.full((a.shape[0],), float(SIGN_CHUNK), dtype=torch.float64)
            counts[-1] = n - (a.shape[0] - 1) * SIGN_CHUNK
            sc = (a.double().sum(1) / counts).float().repeat_interleave(SIGN_CHUNK)[:n]
            st["s"], st["p"], st["q"] = _pack(neg, 1), sc, -sc
        else:
            sc = float(c.abs().double().sum() / n)
            st["s"], st["p"], st["q"] = _pack(neg, 1), sc, -sc
            if name == "efsignsgd":
                r.copy_(c - torch.where(neg, -sc, sc))

    def dec() -> None:
        p, q = (torch.as_tensor(st[k], dtype=torch.float32) for k in ("p", "q"))
        torch.where(_unpack(st["s"], 1).bool(), q, p, out=out)

    return enc, dec


def _casts(name: str, g: torch.Tensor, out: torch.Tensor) -> tuple[Fn, Fn]:
    n = g.numel()
    if name in ("fp16", "bf16"):
        h = torch.empty(n, dtype=torch.float16 if name == "fp16" else torch.bfloat16)
        return (lambda: h.copy_(g)), (lambda: out.copy_(h))
    q = torch.empty(n, dtype=torch.int8)
    sc: dict[str, torch.Tensor] = {}

    def enc() -> None:
        s = g.view(-1, 256).abs().amax(1, keepdim=True) / 127
        sc["s"] = s
        q.copy_(torch.round(g.view(-1, 256) / s).clamp(-127, 127).view(-1))

    return enc, lambda: torch.mul(q.view(-1, 256), sc["s"], out=out.view(-1, 256))


def _quantisers(name: str, g: torch.Tensor, r: torch.Tensor, out: torch.Tensor) -> tuple[Fn, Fn]:
    n = g.numel()
    st: dict[str, Any] = {}

    def enc() -> None:
        if name == "terngrad":
            lo, hi = torch.aminmax(g)
            gap = (hi - lo) / 3
            qv = torch.floor((g - lo) / gap + torch.rand(n)).clamp(0, 3)
            st["q"], st["lo"], st["gap"] = _pack(qv.to(torch.uint8), 2), lo, gap
        elif name == "qsgd":
            nm = g.view(-1, 512).norm(dim=1, keepdim=True)
            lv = torch.floor(g.view(-1, 512).abs() / nm * 7 + torch.rand(n // 512, 512)).clamp(0, 7)
            qv = lv.to(torch.uint8) | ((g.view(-1, 512) < 0).to(torch.uint8) << 3)
            st["q"], st["nm"] = _pack(qv.view(-1), 4), nm
        else:
            c = g + r
            qv = torch.where(c >= 0.01, 1, torch.where(c <= -0.01, 2, 0)).to(torch.uint8)
            st["q"] = _pack(qv, 2)
            r.copy_(c - torch.where(qv == 1, 0.01, torch.where(qv == 2, -0.01, 0.0)))

    def dec() -> None:
        if name == "terngrad":
            torch.add(st["lo"], _unpack(st["q"], 2).float() * st["gap"], out=out)
        elif name == "qsgd":
            u = _unpack(st["q"], 4).view(-1, 512)
            v = st["nm"] * ((u & 7).float() / 7)
            out.view(-1, 512).copy_(torch.where(u >> 3 == 1, -v, v))
        else:
            u = _unpack(st["q"], 2)
            out.copy_(torch.where(u == 1, 0.01, torch.where(u == 2, -0.01, 0.0)))

    return enc, dec


def _sparsifiers(name: str, g: torch.Tensor, r: torch.Tensor, out: torch.Tensor) -> tuple[Fn, Fn]:
    """topk, randomk, dgc, graddrop: indices and values; decode is a scatter."""
    n = g.numel()
    st: dict[str, Any] = {}
    u = torch.zeros(n) if name == "dgc" else r
    frac = 0.001 if name == "dgc" else 0.01  # dgc's s_percent; the others send 1%

    def enc_sparse() -> None:
        if name == "dgc":  # momentum correction: u = m u + g, v = v + u (in place)
            u.mul_(0.9).add_(g)
            c = r.add_(u)
        else:
            c = g + r if name != "randomk" else g
        kk = max(1, math.ceil(n * frac))
        if name == "topk":
            idx = torch.topk(c.abs(), kk, sorted=False).indices.sort().values
        elif name == "randomk":
            idx = torch.randperm(n)[:kk].sort().values
        else:  # dgc / graddrop: sampled threshold + compaction
            ns = max(math.ceil(n * 0.001), 16000 if name == "dgc" else 1600)
            sample = c[torch.randint(0, n, (min(n, ns),))].abs()
            thr = torch.kthvalue(
                sample, max(1, sample.numel() - math.ceil(sample.numel() * frac))
            ).values
            idx = torch.nonzero(c.abs() >= thr).view(-1)[: 2 * kk]
        st["i"], st["v"] = idx, c[idx]
        if name == "dgc":  # momentum factor masking
            u[idx] = 0
            r[idx] = 0
        elif name != "randomk":
            r.copy_(c)
            r[idx] = 0

    def dec_sparse() -> None:
        out.zero_()
        out.index_put_((st["i"],), st["v"], accumulate=True)

    return enc_sparse, dec_sparse
