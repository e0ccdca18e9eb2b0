"""Payload layout: the byte format every backend reads and writes.

Fields are laid out in declaration order; each starts at a multiple of 8 bytes and the total is a
multiple of 8, so payloads of several tensors can be concatenated and stay aligned. Scalars and
arrays are little-endian in their storage type; packed ``uint<b>`` arrays hold element j in bits
``(j % (8/b)) * b`` upwards of byte ``j // (8/b)``; unused bits are zero.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hipress.compll.ir import nodes as ir
from hipress.compll.ir.calls import check_count
from hipress.compll.ir.interp import eval_size
from hipress.compll.ir.types import ArrayType, DType, torch_compute_dtype, torch_storage_dtype

ALIGN = 8


def _up(x: int) -> int:
    return (x + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class FieldLayout:
    name: str
    offset: int
    nbytes: int
    length: int  # elements (1 for scalars)


def layout(prog: ir.Program, n: int) -> tuple[list[FieldLayout], int]:
    """Offsets and sizes of each payload field for ``n`` elements, and the total size."""
    check_count(f"{prog.name} payload layout", n)
    out = []
    off = 0
    for f in prog.payload:
        if isinstance(f.type, DType):
            length, nbytes = 1, f.type.nbytes
        else:
            length = eval_size(f.type.length, n)
            if f.type.bits is not None:
                nbytes = (length * f.type.bits + 7) // 8
            else:
                nbytes = length * f.type.dtype.nbytes
        out.append(FieldLayout(f.name, off, nbytes, length))
        off = _up(off + nbytes)
    return out, off


# Every NaN is stored as the positive quiet NaN, so payload bytes do not depend on how a backend
# propagates NaN payload bits.
CANONICAL_NAN = {
    "f8e4m3": 0x7F,
    "f8e5m2": 0x7F,
    "f16": 0x7E00,
    "bf16": 0x7FC0,
    "f32": 0x7FC00000,
    "f64": 0x7FF8000000000000,
}
_SAME_WIDTH_INT = {8: torch.uint8, 16: torch.int16, 32: torch.int32, 64: torch.int64}


def _to_bytes(v: torch.Tensor, dt: DType) -> torch.Tensor:
    v = v.reshape(-1)
    if dt.is_int:
        parts = [((v >> (8 * j)) & 0xFF) for j in range(dt.nbytes)]
        return torch.stack(parts, dim=1).reshape(-1).to(torch.uint8)
    if dt.is_bool:
        return v.to(torch.uint8)
    bits = v.to(torch_storage_dtype(dt)).contiguous().view(_SAME_WIDTH_INT[dt.bits]).clone()
    bits[torch.isnan(v)] = CANONICAL_NAN[dt.name]
    return bits.view(torch.uint8)


def _from_bytes(b: torch.Tensor, dt: DType) -> torch.Tensor:
    if dt.is_int:
        w = b.reshape(-1, dt.nbytes).to(torch.int64)
        v = torch.zeros(w.shape[0], dtype=torch.int64, device=b.device)
        for j in range(dt.nbytes):
            v |= w[:, j] << (8 * j)
        if dt.is_signed and dt.bits < 64:
            half = 1 << (dt.bits - 1)
            v = ((v + half) & ((1 << dt.bits) - 1)) - half
        return v
    if dt.is_bool:
        return b != 0
    return b.contiguous().view(torch_storage_dtype(dt)).to(torch_compute_dtype(dt))


def pack_bits(v: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack values < 2**bits (int64) LSB-first into uint8."""
    per = 8 // bits
    n = v.shape[0]
    pad = (-n) % per
    w = torch.cat([v, torch.zeros(pad, dtype=v.dtype, device=v.device)]).reshape(-1, per)
    shifts = torch.arange(per, device=v.device, dtype=torch.int64) * bits
    return (w << shifts).sum(dim=1).to(torch.uint8)


def unpack_bits(b: torch.Tensor, bits: int, length: int) -> torch.Tensor:
    per = 8 // bits
    shifts = torch.arange(per, device=b.device, dtype=torch.int64) * bits
    v = (b.to(torch.int64).reshape(-1, 1) >> shifts) & ((1 << bits) - 1)
    return v.reshape(-1)[:length]


def pack(prog: ir.Program, n: int, values: list[torch.Tensor], out: torch.Tensor) -> None:
    """Write field ``values`` (compute dtype) into the uint8 buffer ``out``."""
    fields, total = layout(prog, n)
    if out.shape[0] != total:
        raise ValueError(f"payload buffer has {out.shape[0]} bytes, need {total}")
    out.zero_()
    for f, slot, v in zip(fields, prog.payload, values, strict=True):
        if isinstance(slot.type, ArrayType) and slot.type.bits is not None:
            data = pack_bits(v[: f.length], slot.type.bits)
        else:
            dt = slot.type if isinstance(slot.type, DType) else slot.type.dtype
            data = _to_bytes(v[: f.length] if v.dim() else v, dt)
        out[f.offset : f.offset + f.nbytes] = data
    return None


def unpack(prog: ir.Program, n: int, payload: torch.Tensor) -> list[torch.Tensor]:
    """Read the fields of ``payload`` back into compute-dtype tensors."""
    fields, total = layout(prog, n)
    if payload.dtype != torch.uint8 or payload.dim() != 1 or payload.shape[0] != total:
        raise ValueError(
            f"payload must be a 1-D uint8 tensor of {total} bytes for n={n}, got "
            f"{tuple(payload.shape)} {payload.dtype}"
        )
    vals = []
    for f, slot in zip(fields, prog.payload, strict=True):
        raw = payload[f.offset : f.offset + f.nbytes]
        if isinstance(slot.type, ArrayType) and slot.type.bits is not None:
            vals.append(unpack_bits(raw, slot.type.bits, f.length))
        elif isinstance(slot.type, DType):
            vals.append(_from_bytes(raw, slot.type).reshape(()))
        else:
            vals.append(_from_bytes(raw, slot.type.dtype))
    return vals
