"""Fuzzing the options of the benchmarks, the demo, ``plan`` and ``profile``: generated values
(text, numbers of every size, rates with and without units, lists, paths) for one to three
options at once are parsed and checked in-process, as ``hipress.cli.main`` does before any
work. Each either ends as a usage error (status 2, the usage and ONE error line naming the
option, no traceback) or is accepted; an accepted value of a rule's number outside its range
is a failure, and so is any other exception.

A short run is part of the test suite; a long one::

    HIPRESS_FUZZ_EXAMPLES=5000 .venv/bin/python -m pytest -q tests/test_fuzz_cli.py
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from hipress.cli import build_parser
from hipress.cli.checks import Int, Num, check_args, subparser
from hipress.cli.checktable import RULES

FUZZ = int(os.environ.get("HIPRESS_FUZZ_EXAMPLES", "0"))
PARSER = build_parser()
ERROR = re.compile(
    r"^hipress( [\w-]+)+: error: (argument (--[\w-]+|profiles|[\w/]+): \S|unrecognized arguments: |the following arguments are required: )"
)
BASE: dict[tuple[str, ...], list[str]] = {
    ("plan",): ["--model", "mlp", "--workers", "4", "--bandwidth", "1gbit"],
    ("profile",): ["--out", "p.json"],
    ("bench", "ring"): ["p.json"],
}


def _options(path: tuple[str, ...]) -> list[tuple[str, argparse.Action]]:
    sub = subparser(PARSER, path)
    return [
        (next(o for o in a.option_strings if o.startswith("--")), a)
        for a in sub._actions
        if a.option_strings and a.nargs != 0 and not isinstance(a, argparse._HelpAction)
    ]


PAIRS = [(path, opt, action) for path in RULES for opt, action in _options(path)]
WORDS = ["", ",", "all", "auto", "default", "loopback", "none", "onebit", "onebit:fp32",
         "terngrad:int8", "lstm-lm", "mlp", "nan", "inf", "-inf", "1e999", "-0", "0x10", "1_000",
         "１２", "/", "/proc/x", "/dev/null", ".", "..", "a/b", "\t", "1K", "64M", "2G", "1e3",
         "10gbit", "0gbit", "-1mbit", "1.25GB/s", "25us", "0.1ms", "-1s", "a\0b"]  # fmt: skip
VALUES = st.one_of(
    st.sampled_from(WORDS),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.from_regex(r"-?\d{0,5}(\.\d{0,3})?([eE]-?\d{1,3})?[kKmMgGtT]?(bit|b|B)?(/s|ps)?",
                  fullmatch=True),
    st.lists(st.sampled_from(WORDS[:12]), min_size=1, max_size=3).map(",".join),
    st.text(max_size=12),
)  # fmt: skip


def _settings(short: int) -> settings:
    return settings(max_examples=max(short, FUZZ) if FUZZ else short, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])  # fmt: skip


def _check(argv: list[str]) -> int | None:
    """Parse and check ``argv`` as ``main`` does; None when accepted, else 2 (asserting the
    one error line)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            args = PARSER.parse_args(argv)
        except SystemExit as exc:
            status: int | None = int(exc.code or 0)
        else:
            status = check_args(PARSER, args, RULES)
    text = err.getvalue()
    if status is None:
        return None
    assert status == 2 and "Traceback" not in text, text
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith(("usage:", " "))]
    assert len(lines) == 1 and ERROR.match(lines[0]), text
    return 2


@_settings(60)
@given(data=st.data())
def test_generated_values_end_as_usage_errors_or_are_accepted(
    data: st.DataObject, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # relative --out paths land here (nothing is written)
    picks = data.draw(st.lists(st.sampled_from(PAIRS), min_size=1, max_size=3))
    path = picks[0][0]
    argv = [*path, *BASE.get(path, [])]
    for p, opt, _ in picks:
        if p == path:
            argv.append(f"{opt}={data.draw(VALUES)}")
    note(repr(argv))
    _check(argv)


@_settings(40)
@given(data=st.data())
def test_numbers_outside_a_rule_are_refused(data: st.DataObject) -> None:
    numeric = [(p, d, r) for p in RULES for d, r in RULES[p].items()
               if isinstance(r, Int | Num) and d not in ("sizes", "rates", "net_mbit", "rate_mbit")]  # fmt: skip
    path, dest, rule = data.draw(st.sampled_from(numeric))
    opt = next(o for o, a in _options(path) if a.dest == dest)
    hi = rule.hi() if callable(rule.hi) else rule.hi
    below = (
        st.integers(max_value=int(rule.lo) - 1)
        if isinstance(rule, Int)
        else st.floats(max_value=rule.lo, exclude_max=not rule.open_lo, allow_nan=False)
    )
    above = st.integers(min_value=int(hi) + 1) if isinstance(rule, Int) else st.floats(
        min_value=hi, exclude_min=True)  # fmt: skip
    value = data.draw(st.one_of(below, above))
    if isinstance(rule, Num) and value in rule.also:
        return
    argv = [*path, *BASE.get(path, []), f"{opt}={value}"]
    note(repr(argv))
    assert _check(argv) == 2, f"accepted {argv}"
