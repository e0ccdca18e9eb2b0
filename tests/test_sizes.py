"""Small files and small functions: every module under ``hipress/`` is under
:data:`MODULE_LINES` lines and every function (method, nested function) under
:data:`FUNCTION_LINES`, but those in :data:`ALLOWED`.

:data:`ALLOWED` may only shrink: an entry that fits now fails the test until it is removed, so
a module or function, once split, stays within the limits.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODULE_LINES = 400
FUNCTION_LINES = 80

# Not yet split (each entry goes when it fits): "path" for a module, "path::name" for a function.
ALLOWED: frozenset[str] = frozenset()


def _functions(node: ast.AST, prefix: str = "") -> list[tuple[str, int]]:
    """``(qualified name, lines)`` of every function in ``node`` (``Class.method``,
    ``outer.inner``); a function's lines run from its ``def`` to its last line."""
    out: list[tuple[str, int]] = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = f"{prefix}{child.name}"
            if not isinstance(child, ast.ClassDef):
                assert child.end_lineno is not None
                out.append((name, child.end_lineno - child.lineno + 1))
            out += _functions(child, name + ".")
        else:
            out += _functions(child, prefix)
    return out


@functools.cache
def _sizes() -> dict[str, int]:
    """Lines of every module (``path``) and function (``path::qualified.name``) under
    ``hipress/``."""
    out: dict[str, int] = {}
    for path in sorted(ROOT.joinpath("hipress").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        text = path.read_text()
        out[rel] = len(text.splitlines())
        for name, lines in _functions(ast.parse(text, rel)):
            out[f"{rel}::{name}"] = max(out.get(f"{rel}::{name}", 0), lines)
    return out


def _over() -> dict[str, int]:
    return {
        k: n for k, n in _sizes().items() if n >= (FUNCTION_LINES if "::" in k else MODULE_LINES)
    }


def test_the_sizes_are_read() -> None:
    sizes = _sizes()
    assert sizes["hipress/core/plan.py"] > 50
    assert 5 < sizes["hipress/timing.py::time_once"] < FUNCTION_LINES
    assert 0 < sizes["hipress/selftest_report.py::Report.check"] < 10


def test_every_module_and_function_is_small_but_those_allowed() -> None:
    over = {k: n for k, n in _over().items() if k not in ALLOWED}
    assert not over, (
        f"not under {MODULE_LINES} lines (a module) or {FUNCTION_LINES} (a function): "
        f"{over}; split it along its jobs"
    )


def test_the_allowed_list_only_shrinks() -> None:
    sizes, over = _sizes(), _over()
    gone = sorted(k for k in ALLOWED if k not in sizes)
    fits = sorted(k for k in ALLOWED if k in sizes and k not in over)
    assert not gone, f"ALLOWED names what no longer exists: {gone}; remove it"
    assert not fits, f"ALLOWED names what now fits: {fits}; remove it from the list"
