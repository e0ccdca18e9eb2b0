"""Argument readers the subcommands share: a ``.cll`` file or a shipped algorithm's name,
``--param NAME=VALUE`` for CompLL (:func:`parse_params`) and for SeCoPa (:func:`parse_param`),
element counts, bandwidths and link rates, latencies and strategy lists. Each raises
``argparse.ArgumentTypeError`` (or :class:`~hipress.compll.CllError`) with an example of what
it expects."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hipress.compll.algorithm import algorithms, shipped_path
from hipress.compll.ir.calls import MAX_ELEMENTS
from hipress.compll.ir.source import CllError, SourceFile
from hipress.core.plan import Strategy

# Where every command writes its results unless told otherwise (``--out``).
RESULTS = "hipress-results"


def read_source(arg: str) -> SourceFile:
    """A ``.cll`` file, or a shipped algorithm given by name (``hipress show terngrad``)."""
    path = Path(arg)
    if not path.exists() and arg in algorithms():
        path = shipped_path(arg)
    elif not path.exists() and "/" not in arg and not arg.endswith(".cll"):
        raise CllError(
            f"{arg}: no such file, nor a shipped algorithm (shipped: {', '.join(algorithms())})"
        )
    return SourceFile.read(path)


def parse_params(items: list[str]) -> dict[str, object]:
    """``--param NAME=VALUE`` items: true/false, integers, then floats (``nan``, ``1e-3``)."""
    out: dict[str, object] = {}
    for item in items:
        if "=" not in item:
            raise CllError(f"--param expects NAME=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        low = v.strip().lower()
        val: object
        if low in ("true", "false"):
            val = low == "true"
        else:
            try:
                val = int(v)
            except ValueError:
                try:
                    val = float(v)
                except ValueError:
                    raise CllError(f"--param {k}: {v!r} is not a number or bool") from None
        out[k.strip()] = val
    return out


def count(text: str) -> int:
    """An argparse type: an element count in [0, 2**40]."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 0 <= v <= MAX_ELEMENTS:
        raise argparse.ArgumentTypeError(f"{text} is not an element count in [0, 2**40]")
    return v


_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_RATE = re.compile(
    r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMgGtT]?)(bit|b|B)(/s|ps)?\s*$"
)
_TIME = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(ns|us|µs|ms|s)\s*$")
_TIME_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}


def parse_bandwidth(text: str) -> float:
    """``10gbit``, ``10Gbps``, ``100mbit/s``, ``1.25GB/s`` -> bytes per second.

    ``bit``/lower-case ``b`` are bits, upper-case ``B`` bytes; prefixes are decimal (k, M, G, T).
    Raises ``argparse.ArgumentTypeError`` with examples on anything else.
    """
    m = _RATE.match(text)
    if not m or not 0 < float(m.group(1)) < math.inf:
        raise argparse.ArgumentTypeError(
            f"bad bandwidth {text!r}: use e.g. 10gbit, 25Gbps, 100mbit/s or 1.25GB/s"
        )
    value = float(m.group(1)) * _PREFIX[m.group(2).lower()]
    return value if m.group(3) == "B" else value / 8.0


LOOPBACK = ("loopback", "none", "unshaped")


def parse_rate_mbit(text: str) -> float | None:
    """A link rate with its unit (``1gbit``, ``100mbit``, ``1.25GB/s``) -> Mbit/s, or None for
    ``loopback`` (also ``none``, ``unshaped``): the unshaped local network."""
    if text.strip().lower() in LOOPBACK:
        return None
    return parse_bandwidth(text) * 8.0 / 1e6


def positive(text: str) -> int:
    """An argparse type: an integer >= 1 (a process count)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a count >= 1")
    return v


def parse_latency(text: str) -> float:
    """``25us``, ``0.1ms``, ``2e-5s`` -> seconds."""
    m = _TIME.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"bad latency {text!r}: use e.g. 25us, 0.1ms or 2e-5s")
    return float(m.group(1)) * _TIME_UNIT[m.group(2)]


def parse_param(text: str) -> tuple[str, Any]:
    """``key=value`` with value parsed as int, float, true/false, or left a string."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"bad parameter {text!r}: use key=value")
    value: Any = raw
    if raw.lower() in ("true", "false"):
        value = raw.lower() == "true"
    else:
        for conv in (int, float):
            try:
                value = conv(raw)
                break
            except ValueError:
                pass
    return key, value


def parse_strategies(text: str) -> tuple[Strategy, ...]:
    try:
        out = tuple(Strategy(s.strip()) for s in text.split(",") if s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"bad strategies {text!r}: use allgather, ps, ring"
        ) from None
    if not out or Strategy.ALLREDUCE in out:
        raise argparse.ArgumentTypeError("give compressed strategies: allgather, ps, ring")
    return out


def check_params(value: str, raw: Any, loader: Callable[..., Any]) -> None:
    """Raise :class:`~hipress.cli.checks.UsageError` for ``--param`` unless algorithm ``value``
    loads with the items ``raw`` (``K=V`` strings, or already parsed pairs) through ``loader``
    (``load`` or ``load_rounds``) on the reference backend."""
    from hipress.cli.checks import UsageError

    try:
        params = dict(raw) if raw and isinstance(raw[0], tuple) else parse_params(raw)
        loader(value, backend="reference", **params)
    except (CllError, KeyError, TypeError, ValueError) as exc:
        text = " ".join(str(exc).split())
        raise UsageError("--param", " ".join(map(str, raw)), f"does not fit {value}: {text}",
                         f"`hipress show {value}` lists its parameters") from None  # fmt: skip
