"""Plain-text helpers of the backends: generated source shown with line numbers (compile
errors, see :func:`hipress.compll.backends.cache.explain`)."""

from __future__ import annotations


def numbered(source: str, around: int | None = None, context: int = 8) -> str:
    """``source`` with line numbers (only ``context`` lines around line ``around`` if given)."""
    lines = source.splitlines()
    lo, hi = 0, len(lines)
    if around is not None:
        lo, hi = max(0, around - 1 - context), min(len(lines), around + context)
    width = len(str(hi))
    return "\n".join(f"{k + 1:>{width}} | {lines[k]}" for k in range(lo, hi))


__all__ = ["numbered"]
