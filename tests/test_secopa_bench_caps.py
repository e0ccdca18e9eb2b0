"""``hipress bench e2e --bucket-cap-mb``: hipress rows at DDP bucket caps side by side, and
the network floor under a row's DDP buckets."""

from __future__ import annotations

import pytest

from hipress.bench.e2e_caps import parse_caps, resolve
from hipress.bench.e2e_configs import COMPUTE, E2EOptions, configs_for
from hipress.bench.e2e_rows import floors
from hipress.bench.tail import bucket_leads


def test_each_cap_is_a_hipress_row_of_its_own_and_ddp_keeps_its_buckets() -> None:
    assert parse_caps("default,auto,2,2.0") == (None, "auto", 2.0)
    for bad in ("abc", "0", "-1", "nan", "inf"):
        with pytest.raises(ValueError, match=bad):
            parse_caps(f"default,{bad}")
    opts = E2EOptions(workers=2, models=("lstm-lm",), algorithms=("onebit",), row_sparse=("none",),
                      bucket_caps=(None, "auto", 2.0))  # fmt: skip
    by = {c.name: c for c in configs_for(opts)}
    assert [n for n in by if n.startswith("hipress")] == [
        "hipress-onebit", "hipress-onebit-cap-auto", "hipress-onebit-cap2",
        "hipress-none-rows", "hipress-none-rows-cap-auto", "hipress-none-rows-cap2",
    ]  # fmt: skip
    assert by["ddp-fp32"].bucket_cap_mb is None and by["ddp-powersgd"].bucket_cap_mb == 4096
    assert by["hipress-onebit"].describe().endswith("DDP's default buckets")
    assert by["hipress-none-rows-cap2"].describe().endswith("bucket_cap_mb 2")
    # without a link rate (loopback) auto keeps DDP's default and says why
    done = resolve(by["hipress-onebit-cap-auto"], "lstm-lm", None, {}, 2, None, {})
    assert done.bucket_cap_mb is None and "no recommendation" in done.cap_advice["reason"]
    assert done.describe().endswith("DDP's default buckets (SeCoPa's recommendation)")
    with pytest.raises(ValueError, match="bucket_caps"):
        E2EOptions(bucket_caps=(0.0,))


def test_the_floor_under_ddp_buckets() -> None:
    # "d" (0.5 MiB) is ready 50 ms before the end, "e" (1 MiB) last: one bucket at DDP's
    # default (the 1 MiB first bucket closes only with both), each alone at 0.25 MB
    numels = {"e": 1 << 18, "d": 1 << 17}
    leads = {"e": 0.0, "d": 50.0}
    assert bucket_leads(leads, numels, 25.0, 1.0) == {"e": 0.0, "d": 0.0}
    assert bucket_leads(leads, numels, 0.25, 0.25) == leads
    entries = [["e", 1 << 18, False, "allreduce", 1], ["d", 1 << 17, False, "allreduce", 1]]
    compute = {"config": COMPUTE.name, "samples_per_s": 1.0, "step_ms": 100.0,
               "grad_ready_lead_ms": leads}  # fmt: skip
    rows = [{"config": f"hipress-none{s}", "samples_per_s": 1.0, "plan": {"entries": entries},
             "bucket_cap_mb": cap} for s, cap in (("", None), ("-cap0.25", 0.25))]  # fmt: skip
    floors([compute, *rows], numels, 2, 100.0)  # 12.5 kB per ms; 2 ranks send 4 B an element
    default, small = rows
    mib_ms = (1 << 20) / 12.5e3
    # e's MiB after backward, d's half hidden behind the 50 ms before it
    assert default["network_floor_ms"] == small["network_floor_ms"] == pytest.approx(mib_ms)
    assert default["bucket_floor_ms"] == pytest.approx(1.5 * mib_ms)  # d waits for e
    assert small["bucket_floor_ms"] == pytest.approx(mib_ms)
    assert default["bucket_efficiency_bound"] < small["bucket_efficiency_bound"]
