"""Plain-text helpers of the backends: generated source shown with line numbers, and a
compiler's log explained with the source around each error."""

from __future__ import annotations

import re


def numbered(source: str, around: int | None = None, context: int = 8) -> str:
    """``source`` with line numbers (only ``context`` lines around line ``around`` if given)."""
    lines = source.splitlines()
    lo, hi = 0, len(lines)
    if around is not None:
        lo, hi = max(0, around - 1 - context), min(len(lines), around + context)
    width = len(str(hi))
    return "\n".join(f"{k + 1:>{width}} | {lines[k]}" for k in range(lo, hi))


def explain(log: str, source: str, fname: str) -> str:
    """A compiler ``log`` for generated ``source`` with the source shown, numbered, around each
    error line (gcc/clang ``file:LINE:COL: error``, NVRTC ``file(LINE): error``)."""
    pat = rf"{re.escape(fname)}(?::(\d+):(?:\d+:)?|\((\d+)\):) (?:fatal )?error"
    lines = sorted({int(m.group(1) or m.group(2)) for m in re.finditer(pat, log)})
    parts = [f"generated code failed to compile:\n{log.strip()}"]
    for ln in lines[:3]:
        parts.append(f"\ngenerated source around line {ln}:\n{numbered(source, ln)}")
    if not lines:
        parts.append(f"\ngenerated source:\n{numbered(source)}")
    return "\n".join(parts)


__all__ = ["explain", "numbered"]
