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


# the 8-bit float storage types: (name, exponent bias, mantissa bits, f32 bits of the least
# magnitude that overflows, the code it becomes, the test of a NaN code on its low 7 bits)
_FP8 = (
    ("f8e4m3", 7, 3, 0x43E00000, 0x7E, "== 0x7fu"),  # saturates at 448 (torch float8_e4m3fn)
    ("f8e5m2", 15, 2, 0x47700000, 0x7C, "> 0x7cu"),  # from 61440 up: inf (torch float8_e5m2)
)


def _fp8() -> str:
    """C for the fp8 storage types (kept as their byte): f32 -> fp8 rounding to nearest even,
    with overflow saturating (e4m3) or going to inf (e5m2) and NaN -> sign | 0x7f, as torch
    converts; fp8 -> f32 exactly; the canonical payload NaN (0x7f); the select."""
    out = ["/* ---- f8e4m3 / f8e5m2 (storage types, kept as their byte) ---- */"]
    for name, bias, mant, over, big, nan in _FP8:
        shift = 23 - mant
        magic = (127 + 1 - bias - mant + 23) << 23  # adding it rounds a subnormal to its quantum
        out.append(f"""HP_FN uint8_t hp_f32_to_{name}(float f) {{
  const uint32_t x = hp_f32_bits(f), sign = (x >> 24) & 0x80u, a = x & 0x7fffffffu;
  const uint32_t sub = hp_f32_bits(hp_f32_from_bits(a) + hp_f32_from_bits({magic}u)) - {magic}u;
  const uint32_t nrm = (a + ((uint32_t)({bias} - 127) << 23) + {(1 << (shift - 1)) - 1}u
                        + ((a >> {shift}) & 1u)) >> {shift};
  const uint32_t top = hp_sel_u32(a > 0x7f800000u, 0x7fu, {big:#x}u);
  const uint32_t o = hp_sel_u32(a >= {over:#x}u, top, hp_sel_u32(a < {(128 - bias) << 23}u, sub, nrm));
  return (uint8_t)(o | sign);
}}
HP_FN uint8_t hp_canon_{name}(uint8_t c) {{ return hp_sel_u8((c & 0x7fu) {nan}, 0x7fu, c); }}
HP_FN uint8_t hp_sel_{name}(bool c, uint8_t a, uint8_t b) {{ return hp_sel_u8(c, a, b); }}""")
    out.append("""HP_FN float hp_f8e4m3_to_f32(uint8_t c) {
  const uint32_t a = c & 0x7fu, sign = ((uint32_t)c & 0x80u) << 24;
  const uint32_t nrm = (a << 20) + ((uint32_t)(127 - 7) << 23);
  const uint32_t sub = hp_f32_bits((float)a * 0x1p-9f);
  const uint32_t r = hp_sel_u32(a == 0x7fu, 0x7fc00000u, hp_sel_u32(a < 8u, sub, nrm));
  return hp_f32_from_bits(r | sign);
}
HP_FN float hp_f8e5m2_to_f32(uint8_t c) { return hp_f16_to_f32((uint16_t)((uint16_t)c << 8)); }""")
    return "\n".join(out) + "\n"


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
            fp8=_fp8(),
            **layout,
        )
    )


__all__ = ["prelude"]
