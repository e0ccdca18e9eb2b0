"""The local-step benchmark's rows and argument checks (its figures come from running it:
python -m hipress.bench.diloco)."""

from __future__ import annotations

import pytest

from hipress.bench.diloco import Row, rows_for, run
from hipress.bench.diloco_torchft import version


def test_rows_cover_every_mode_per_h_and_compute_twice() -> None:
    names = [r.name for r in rows_for((4, 16), ("onebit",), (4, 2))]
    tft = version() is not None
    want = ["compute", "ddp", "diloco-none-H4", "diloco-onebit-H4", "postlocal-H4",
            *(["torchft-H4"] if tft else []),
            "diloco-none-H16", "diloco-onebit-H16", "diloco-none-H16-F4-tau2",
            "diloco-onebit-H16-F4-tau2", "postlocal-H16", *(["torchft-H16"] if tft else []),
            "compute"]  # fmt: skip
    assert names == want


def test_steps_must_hold_whole_periods() -> None:
    with pytest.raises(ValueError, match="not a multiple of the H of diloco-none-H16"):
        run(2, None, "lstm-lm", [Row("compute"), Row("diloco", 16)], 24)
