"""``hipress bench ring``: would the original's compressed Ring ever be predicted faster than
CaSync's PS and allgather?

For each measured profile (``hipress profile --out``: the compute costs of one algorithm), world
sizes 2 .. 1024, links of 100 Mbit/s .. 100 Gbit/s and tensors of 1K .. 256M elements: the best K
of each strategy under the cost model; prints where Ring wins and writes
``hipress-results/ring.json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from hipress.bench.provenance import stamp
from hipress.bench.report import write_json

__all__ = ["ring_study"]

RING_WORLDS = (2, 3, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
RING_BITS_PER_S = (1e8, 1e9, 1e10, 2.5e10, 1e11)
RING_SIZES = tuple(1 << e for e in range(10, 29))  # 1K .. 256M elements


def _ring_formula(every_hop: bool):  # type: ignore[no-untyped-def]
    """The original's compressed Ring verbatim, or with the compute a compressed ring does.

    Verbatim: ``2(N-1) send(r m/K) + N enc(m/K) + N dec(r m/K) + (N-1) merge(m/K)`` (decode
    costed at the payload's size in float32 elements, as the original's fits were). With
    ``every_hop``: each of the N-1 reduce-scatter hops decodes, merges and re-encodes the chunk
    it received and each of the N-1 all-gather hops decodes one, so ``N enc(m/K) + 2(N-1)
    dec(m/K) + (N-1) merge(m/K)``, decode costed at the elements it produces (what a measured
    ``decode(n)`` means). Both keep the original's ``"sum"``: hops are not pipelined.
    """
    import dataclasses

    from hipress.secopa.model.formulas import ORIGINAL_FORMULAS, Term

    ring = next(f for f in ORIGINAL_FORMULAS if f.name == "ring_compressed")
    if not every_hop:
        return ring
    compute = tuple(
        Term("decode", lambda d: 2.0 * (d.n - 1), lambda d: d.part) if t.op == "decode" else t
        for t in ring.compute
    )
    return dataclasses.replace(ring, name="ring_compressed_every_hop", compute=compute)


def _rows(base: Any, latency_s: float, formulas: tuple[Any, ...]) -> list[dict[str, Any]]:
    """Predicted times of every formula at each overlap, link, world size and tensor size."""
    from hipress.secopa.model.costmodel import CostModel

    rows = []
    for overlap in (0.0, base.overlap):
        for bits in RING_BITS_PER_S:
            prof = base.with_link(bits / 8, latency_s, overlap=overlap)
            for n in RING_WORLDS:
                cm = CostModel(prof, n, formulas)
                for m in RING_SIZES:
                    t = {name: float(np.min(cm.times(name, m))) for name in cm.formulas}
                    casync = min(t["ps"], t["allgather"])
                    rows.append({"overlap": overlap, "bits_per_s": bits, "n": n, "m": m,
                                 **{k: round(v, 6) for k, v in t.items()},
                                 "ring_wins": t["ring_compressed"] < casync,
                                 "ring_every_hop_wins": t["ring_compressed_every_hop"] < casync,
                                 "ring_over_best": t["ring_compressed"] / casync})  # fmt: skip
    return rows


def _summary(name: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per Ring variant and overlap: where Ring wins and its best ratio; printed as it goes."""
    summary = {}
    for variant in ("ring_compressed", "ring_compressed_every_hop"):
        for ov in sorted({r["overlap"] for r in rows}):
            mine = [r for r in rows if r["overlap"] == ov]
            wins = [r for r in mine if r[variant] < min(r["ps"], r["allgather"])]
            ratio = [r[variant] / min(r["ps"], r["allgather"]) for r in mine]
            i = int(np.argmin(ratio))
            at = mine[i]
            s = {
                "cases": len(mine),
                "wins": len(wins),
                "worlds": sorted({r["n"] for r in wins}),
                "bits_per_s": sorted({r["bits_per_s"] for r in wins}),
                "sizes": [min(r["m"] for r in wins), max(r["m"] for r in wins)] if wins else [],
                "wins_at_n2_3": sum(r["n"] <= 3 for r in wins),
                "wins_at_n_ge_64": sum(r["n"] >= 64 for r in wins),
                "best_ratio": round(ratio[i], 3),
                "best_at": {"n": at["n"], "bits_per_s": at["bits_per_s"], "m": at["m"]},
            }
            summary[f"{variant}@overlap={ov}"] = s
            print(f"{name:<9}{variant:<26} overlap {ov:.1f}: Ring faster in "
                  f"{s['wins']:>4} of {s['cases']} (N=2-3: {s['wins_at_n2_3']}, "
                  f"N>=64: {s['wins_at_n_ge_64']}); best ring/min(ps,ag) "
                  f"{s['best_ratio']:.2f} at N={at['n']}, {at['bits_per_s']:.0e} bit/s, "
                  f"m={at['m']}")  # fmt: skip
    return summary


def ring_study(profile_paths: list[str], out_path: str, latency_s: float, command: str) -> int:
    """Is the original's compressed Ring ever predicted faster than CaSync's PS and allgather?

    For each measured profile (compute costs of one algorithm), each world size, link
    bandwidth and tensor size: the best K of each strategy; prints where Ring wins and writes
    the summary to ``out_path``. Returns 0.
    """
    from hipress.secopa.model.costmodel import CASYNC_FORMULAS
    from hipress.secopa.model.profile import Profile

    ring_verbatim, ring_decoded = _ring_formula(False), _ring_formula(True)
    ps, ag = (f for f in CASYNC_FORMULAS if f.name in ("ps", "allgather"))
    algorithms: dict[str, Any] = {}
    result: dict[str, Any] = {"benchmark": "ring", "latency_s": latency_s, "algorithms": algorithms}
    for path in profile_paths:
        base = Profile.load(path)
        rows = _rows(base, latency_s, (ps, ag, ring_verbatim, ring_decoded))
        summary = _summary(base.algorithm, rows)
        algorithms[base.algorithm] = {"profile": base.to_dict(), "summary": summary}
    write_json(stamp(result, command), Path(out_path))
    print(f"results written to {out_path}")
    return 0
