"""What ``hipress selftest`` found and how each check went (:class:`Report`): filled in by the
checks on this machine (:mod:`hipress.selftest`) and by those under ``torchrun``
(:mod:`hipress.selftest_dist`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Report"]


@dataclass
class Report:
    """What the self-test found: ``found`` (name -> version or reason), ``checks`` (name ->
    "pass", "FAIL: ..." or "skipped: ..."), ``figures`` (check name -> what it measured, e.g.
    ``{"compressed": 2, ...}``; a check records them as it runs, so a failed one has them
    too), ``speed`` (the device, its copy GB/s, and per algorithm encode and decode GB/s of
    gradient)."""

    found: dict[str, str] = field(default_factory=dict)
    checks: dict[str, str] = field(default_factory=dict)
    figures: dict[str, dict[str, Any]] = field(default_factory=dict)
    speed: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(v.startswith("FAIL") for v in self.checks.values())

    def check(self, name: str, fn: Callable[[], str | None]) -> None:
        """Run ``fn``: None or "" is a pass, a string a skip reason; an exception a failure."""
        try:
            why = fn()
        except Exception as exc:
            self.checks[name] = f"FAIL: {type(exc).__name__}: {exc}"[:400]
            return
        self.checks[name] = f"skipped: {why}" if why else "pass"
