"""Golden tests: every class of user error renders as path:line:col, the line and a caret.

Each tests/golden/errors/NAME.cll has its full expected message in NAME.err. Regenerate with
HIPRESS_UPDATE_GOLDEN=1 after a deliberate change, and review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hipress.compll import CllError, CllSyntaxError, CllTypeError
from hipress.compll.frontend.check import check_source
from hipress.compll.ir.source import SourceFile

GOLDEN = Path(__file__).parent / "golden" / "errors"
CASES = sorted(p.stem for p in GOLDEN.glob("*.cll"))


def _message(name: str) -> tuple[str, CllError]:
    src = SourceFile(f"{name}.cll", (GOLDEN / f"{name}.cll").read_text())
    with pytest.raises(CllError) as info:
        check_source(src)
    return str(info.value), info.value


@pytest.mark.parametrize("name", CASES)
def test_golden_error(name: str) -> None:
    msg, exc = _message(name)
    golden = GOLDEN / f"{name}.err"
    if os.environ.get("HIPRESS_UPDATE_GOLDEN"):
        golden.write_text(msg + "\n")
    assert golden.exists(), f"no golden for {name}; run with HIPRESS_UPDATE_GOLDEN=1"
    assert msg == golden.read_text().rstrip("\n")
    # the message always starts with path:line:col (or path: for whole-file problems)
    assert msg.startswith(f"{name}.cll:")
    kind = CllSyntaxError if name.startswith("syntax_") else CllTypeError
    assert isinstance(exc, kind)


def test_every_golden_has_a_caret_line() -> None:
    for name in CASES:
        msg, exc = _message(name)
        if exc.span is not None and exc.span.line:
            lines = msg.splitlines()
            assert len(lines) == 3, msg
            assert lines[2].rstrip().endswith(("^", "~")), msg
