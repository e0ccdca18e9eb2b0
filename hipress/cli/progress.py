"""Progress of a long step of a command, on stderr: a tqdm bar where tqdm is installed (the
``demo`` extra) and the output is a terminal, else a plain line every few seconds. Nothing is
shown for a step that ends within ``delay`` seconds, so quick runs and tests stay quiet.

    with phase("measuring terngrad's encode/decode", expect_s=1.5):
        ...
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

__all__ = ["Phase", "invocation", "phase", "step_line", "warn_if_unshaped", "write_report"]

DELAY_S = 2.0  # show nothing for a step shorter than this
EVERY_S = 5.0  # a plain line this often after that


def _tqdm() -> Any:
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm


class Phase:
    """A context manager that reports a step's elapsed time while it runs (see the module).

    Args:
        label: what the step does, e.g. ``measuring the network (2 processes)``.
        expect_s: about how long it takes, for the bar's length and the lines (optional).
        stream: where to write (default stderr).
        bar: use a tqdm bar (default: tqdm installed and stdout and ``stream`` terminals).
        delay, every: seconds before the first report, and between plain lines.
    """

    def __init__(
        self,
        label: str,
        expect_s: float | None = None,
        stream: TextIO | None = None,
        bar: bool | None = None,
        delay: float = DELAY_S,
        every: float = EVERY_S,
    ) -> None:
        self.label, self.expect_s = label, expect_s
        self.stream = stream or sys.stderr
        tty = _isatty(sys.stdout) and _isatty(self.stream)
        self._tqdm = _tqdm() if (bar is None and tty) or bar else None
        self.delay, self.every = delay, every
        self.shown = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._t0 = 0.0
        self._ended = "done in"

    def __enter__(self) -> Phase:
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._ended = "stopped after" if exc_type is not None else "done in"
        self._stop.set()
        self._thread.join()

    def _elapsed(self) -> float:
        return time.monotonic() - self._t0

    def _run(self) -> None:
        if self._stop.wait(self.delay):
            return
        self.shown = True
        if self._tqdm is not None:
            self._run_bar()
            return
        while True:
            self._line(f"{self.label} ... {self._elapsed():.0f} s{self._of()}")
            if self._stop.wait(self.every):
                break
        self._line(f"{self.label}: {self._ended} {self._elapsed():.1f} s")

    def _of(self) -> str:
        return f" (about {self.expect_s:.0f} s)" if self.expect_s else ""

    def _line(self, text: str) -> None:
        print(f"hipress: {text}", file=self.stream, flush=True)

    def _run_bar(self) -> None:
        total = self.expect_s if self.expect_s else None
        fmt = "{desc}: {bar} {elapsed}" if total else "{desc}: {elapsed}"
        bar = self._tqdm(total=total, desc=self.label, file=self.stream, bar_format=fmt)
        try:
            while not self._stop.wait(0.25):
                bar.n = min(self._elapsed(), total) if total else self._elapsed()
                bar.refresh()
            if total:
                bar.n = total
        finally:
            bar.close()


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def phase(label: str, expect_s: float | None = None, **kwargs: Any) -> Phase:
    """A :class:`Phase` for one long step of a command."""
    return Phase(label, expect_s, **kwargs)


def step_line(text: str) -> None:
    """One line of a benchmark's progress on stderr, with the time of day."""
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def invocation(args: Any) -> str:
    """The command line that ran (what results are stamped with)."""
    return str(getattr(args, "invocation", f"hipress bench {getattr(args, 'bench', '')}"))


def warn_if_unshaped(loopback: bool) -> None:
    """Say on stderr when a network benchmark will run on unshaped loopback (``--loopback``,
    or no root/iproute2), so its figures are not taken for a cluster's."""
    from hipress.bench.netsim import shaping_unavailable_reason

    reason = shaping_unavailable_reason() if not loopback else "--loopback given"
    if reason is not None:
        print(
            f"WARNING: no shaped network ({reason}); running on UNSHAPED LOOPBACK: the figures "
            "say nothing about a real cluster's network and are labelled so.",
            file=sys.stderr,
        )


def write_report(results: Any, out: str | Path, name: str, md: str) -> None:
    """Write a benchmark's ``NAME.json`` (``results``) and ``NAME.md`` (``md``) under ``out``,
    then print the markdown and what was written."""
    from hipress.bench.report import write_json

    out = Path(out)
    write_json(results, out / f"{name}.json")
    (out / f"{name}.md").write_text(md)
    print(md)
    print(f"wrote {out / name}.json, .md")
