"""The prelude every C-family source starts with: the helper functions that give the IR's
operations their meaning (integer wrap-around and saturation, float conversions and canonical
NaNs, the random number generator, the bit unpacking tables), rendered from
``templates/prelude*.h.j2`` for the C target or the CUDA target."""

from __future__ import annotations

import struct

from hipress.compll.backends.cfamily.syntax import CTYPE, INT_TYPES
from hipress.compll.backends.render import environment


def _int_table() -> list[dict[str, object]]:
    out = []
    for n in INT_TYPES:
        bits = int(n[1:])
        signed = n[0] == "i"
        c = CTYPE[n]
        wide = "uint64_t" if bits == 64 else "uint32_t"
        out.append({
            "n": n, "c": c, "w": wide, "bits": bits, "signed": signed,
            "u": wide, "kbits": 64 if bits == 64 else 32,
            "sx": ("int64_t" if bits == 64 else "int32_t") if signed else wide,
        })  # fmt: skip
    return out


def _float_table() -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    floats = [
        {"n": "f32", "c": "float", "bits": 32, "k": "int32_t", "u": "uint32_t", "kmax": "0x7fffffff",
         "sfx": "f", "big": "0x1p+23f", "i": "int32_t"},
        {"n": "f64", "c": "double", "bits": 64, "k": "int64_t", "u": "uint64_t",
         "kmax": "INT64_C(0x7fffffffffffffff)", "sfx": "", "big": "0x1p+52", "i": "int64_t"},
    ]  # fmt: skip
    f2i = []
    for n in INT_TYPES:
        bits = int(n[1:])
        signed = n[0] == "i"
        c = CTYPE[n]
        if signed:
            hi1 = bits - 1
            hi = "INT64_MAX" if bits == 64 else ("INT32_MAX" if bits == 32 else str((1 << hi1) - 1))
            lo = "INT64_MIN" if bits == 64 else ("INT32_MIN" if bits == 32 else str(-(1 << hi1)))
            lo1 = {"f32": f"-0x1p+{hi1}f", "f64": f"-0x1p+{hi1}"}
        else:
            hi1 = bits
            hi = f"{(1 << bits) - 1}u"
            lo = "0"
            lo1 = {"f32": "0.0f", "f64": "0.0"}
        below = {  # the largest float below 2**hi1
            "f32": f"{struct.unpack('<f', struct.pack('<I', ((127 + hi1) << 23) - 1))[0].hex()}f",
            "f64": float(2**hi1 - 2 ** (hi1 - 53)).hex(),
        }
        # the clamp alone saturates where the float below 2**hi1 truncates to the maximum
        # (hi1 within the mantissa); wider targets need the final select
        exact = {"f32": hi1 <= 24, "f64": hi1 <= 53}
        f2i.append({"n": n, "c": c, "hi": hi, "lo": lo, "hib": below, "exact": exact,
                    "hi1": {"f32": f"0x1p+{hi1}f", "f64": f"0x1p+{hi1}"}, "lo1": lo1})  # fmt: skip
    return floats, f2i


def _unpack_tables() -> list[dict[str, object]]:
    """For w in 1, 2: byte value -> its 8/w fields of w bits, one per byte, LSB first (4-bit
    fields unpack faster with shifts: gcc vectorises those)."""
    out = []
    for bits in (1, 2):
        per, width = 8 // bits, {1: 16, 2: 8}[bits]
        vals = [
            sum(((v >> (bits * j)) & ((1 << bits) - 1)) << (8 * j) for j in range(per))
            for v in range(256)
        ]
        suffix = "ULL" if per == 8 else "u"
        cells = [f"0x{x:0{2 * per}x}{suffix}," for x in vals]
        rows = [" ".join(cells[k : k + width]) for k in range(0, 256, width)]
        ctype_ = {8: "uint64_t", 4: "uint32_t"}[per]
        out.append({"bits": bits, "ctype": ctype_, "rows": rows})
    return out


def prelude(cuda: bool, **layout: int) -> str:
    """The helper functions every kernel of ``cuda``/C uses (semantics of the IR). ``layout``:
    the target's own constants the template names (the C target's ``tile``, ``maxt`` and
    ``par_min``)."""
    floats, f2i = _float_table()
    return (
        environment()
        .get_template("prelude.h.j2")
        .render(
            cuda=cuda,
            ints=_int_table(),
            floats=floats,
            f2i=f2i,
            unpack=_unpack_tables(),
            **layout,
        )
    )


__all__ = ["prelude"]
