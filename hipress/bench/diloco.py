"""Local-step training on a simulated cluster: hipress's DiLoCo (per algorithm and H), the same
uncompressed, PyTorch's post-local SGD (``PeriodicModelAverager`` in a
``PostLocalSGDOptimizer``) and per-step DDP, against the model's compute-only rate, in one
shaped network (:mod:`hipress.bench.netsim`) and one run.

    python -m hipress.bench.diloco --workers 4 --rate 1000 --hs 4,16 --out diloco.json

Each row runs in fresh worker processes: build the model (:mod:`hipress.bench.workloads`), warm
up for one period of H steps (so the timed steps hold whole periods), then time ``steps``
steps. Figures per row: samples/s (all workers), ``utilisation`` (samples/s over compute-only:
the same N processes exchanging nothing, so CPU sharing is not charged to the network), bytes
each worker put on its wire per step (its NIC's transmit counter), seconds per outer sync (in
all, and its parts: the inner loop standing waiting, encoding, decoding, the outer step), the
final training loss and each rank's peak resident memory. Two bounds: the link (at H inner
steps per sync a row cannot use less than ``bytes per sync / H`` of the link per step; every
row prints its bytes so the bound can be checked against the rate), and the loop's own sync
work (``cpu_bound``: the utilisation left once each sync's encode, decode and outer step are
paid and nothing is waited for, :func:`cpu_bound`).

torchft's ``DiLoCo`` (where torchft imports; :mod:`~hipress.bench.diloco_torchft`) runs with
Nesterov SGD (lr 0.7, momentum 0.9) as the outer optimizer, uncompressed (on CPU its
quantisation is not available); its version is recorded.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import re
import resource
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hipress.bench.diloco_torchft import version
from hipress.bench.netsim import LoopbackNetwork, open_network, run_in_network, tx_bytes
from hipress.bench.workloads import WORKLOADS

__all__ = ["Row", "cpu_bound", "parse_variants", "rows_for", "run", "summarise", "train", "wrap"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Row:
    """One configuration: ``kind`` ("compute", "ddp", "diloco", "postlocal" or "torchft"), ``h`` (inner
    steps per sync; 1 for compute and DDP), ``algorithm`` (DiLoCo's codec; None uncompressed)."""

    kind: str
    h: int = 1
    algorithm: str | None = None
    fragments: int = 1
    delay: int = 0

    @property
    def name(self) -> str:
        if self.kind == "diloco":
            streaming = f"-F{self.fragments}-tau{self.delay}" if self.fragments > 1 else ""
            return f"diloco-{self.algorithm or 'none'}-H{self.h}{streaming}"
        return f"{self.kind}-H{self.h}" if self.kind in ("postlocal", "torchft") else self.kind

    @property
    def variant(self) -> str:
        """The name :func:`parse_variants` reads back (lower case: ``diloco-onebit-h16``)."""
        return self.name.lower()


_VARIANT = re.compile(r"^(?:diloco-(?P<alg>.+?)|(?P<kind>postlocal|torchft))-h(?P<h>\d+)"
                      r"(?:-f(?P<f>\d+)-tau(?P<tau>\d+))?$")  # fmt: skip
# DiLoCoStats' timers -> the per-sync seconds a row reports
_OUTER = {"outer_s": "outer_sync_s", "wait_s": "outer_wait_s", "encode_s": "outer_encode_s",
          "decode_s": "outer_decode_s", "step_s": "outer_step_s"}  # fmt: skip
VARIANT_FORMS = ("diloco-ALGORITHM-hH (ALGORITHM none: uncompressed), diloco-ALGORITHM-hH-fF-tauT "
                 "(streaming), postlocal-hH, torchft-hH, or hH (all of them at H)")  # fmt: skip


def parse_variants(names: tuple[str, ...] | list[str], algorithms: tuple[str, ...] = ()
                   ) -> list[Row]:  # fmt: skip
    """The local-step rows named by ``names`` (:data:`VARIANT_FORMS`; ``hH`` expands to DiLoCo
    uncompressed and with each of ``algorithms``, post-local SGD and, where it imports,
    torchft's DiLoCo, all at H). Raises ValueError naming the entry that is not one, whose
    algorithm is unknown, whose schedule cannot run, or that asks for torchft without it."""
    from hipress.compll import algorithms as shipped
    from hipress.diloco import DiLoCoError
    from hipress.diloco.fragments import Schedule

    out: list[Row] = []
    for name in names:
        key = name.strip().lower()
        m = re.fullmatch(r"h(\d+)", key)
        if m:
            h = int(m.group(1))
            out.extend(parse_variants([f"diloco-{a}-h{h}" for a in ("none", *algorithms)]
                                      + [f"postlocal-h{h}"]
                                      + ([f"torchft-h{h}"] if version() else [])))  # fmt: skip
            continue
        m = _VARIANT.fullmatch(key)
        if m is None:
            raise ValueError(f"local-step variant {name!r}: not a local-step variant; write "
                             f"{VARIANT_FORMS}")  # fmt: skip
        h, alg = int(m["h"]), m["alg"]
        if alg is not None and alg != "none" and alg not in shipped():
            raise ValueError(f"local-step variant {name!r}: unknown algorithm {alg!r}; choose "
                             f"none or one of {', '.join(shipped())}")  # fmt: skip
        if m["kind"] == "torchft" and version() is None:
            raise ValueError(f"local-step variant {name!r}: torchft does not import here")
        if m["f"] is not None and alg is None:
            raise ValueError(f"local-step variant {name!r}: only DiLoCo streams fragments")
        f, tau = (int(m["f"]), int(m["tau"])) if m["f"] is not None else (1, 0)
        try:
            Schedule.checked(h, f, tau)
        except DiLoCoError as exc:
            raise ValueError(f"local-step variant {name!r}: {exc}") from None
        kind = m["kind"] or "diloco"
        row = Row(kind, h, None if alg in (None, "none") else alg, f, tau)
        if row not in out:
            out.append(row)
    return out


def rows_for(hs: tuple[int, ...], algorithms: tuple[str, ...],
             streaming: tuple[int, int] | None = None) -> list[Row]:  # fmt: skip
    """Compute-only, DDP, then per H: DiLoCo uncompressed, per algorithm (and with
    ``streaming`` = (F, tau) each again as Streaming DiLoCo), post-local SGD, torchft's DiLoCo
    (where torchft imports); compute-only again at the end (the better of the two is the
    reference: other load on the machine slows one of them)."""
    out = [Row("compute"), Row("ddp")]
    for h in hs:
        out.append(Row("diloco", h))
        out.extend(Row("diloco", h, a) for a in algorithms)
        if streaming is not None and h >= streaming[0] and streaming[1] < h // streaming[0]:
            out.extend(Row("diloco", h, a, *streaming) for a in (None, *algorithms))
        out.append(Row("postlocal", h))
        if version() is not None:
            out.append(Row("torchft", h))
    out.append(Row("compute"))
    return out


def wrap(model: torch.nn.Module, row: Row, inner: torch.optim.Optimizer, rank: int, world: int,
         addresses: list[str]) -> tuple[Any, Any, Any, Any]:  # fmt: skip
    """``model`` trained as ``row`` says with the optimizer ``inner`` (over its parameters):
    (module to call, optimizer to step, DiLoCo or None, the context to train in).
    ``addresses[r]``: rank r's address (torchft's servers listen there)."""
    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
    from torch.distributed.optim import PostLocalSGDOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    from hipress.diloco import DiLoCo

    if row.kind == "ddp":
        return DDP(model), inner, None, contextlib.nullcontext()
    if row.kind == "torchft":
        from hipress.bench.diloco_torchft import build

        tft, close = build(model, inner, row.h, rank, world, addresses)
        stack = contextlib.ExitStack()
        stack.callback(close)
        stack.enter_context(tft)
        return model, inner, None, stack
    if row.kind == "diloco":
        d = DiLoCo(model, inner, row.h, row.algorithm, fragments=row.fragments,
                   fragment_sync_delay=row.delay)  # fmt: skip
        return model, inner, d, d
    if row.kind == "postlocal":
        averager = PeriodicModelAverager(period=row.h, warmup_steps=0)
        return model, PostLocalSGDOptimizer(inner, averager), None, contextlib.nullcontext()
    return model, inner, None, contextlib.nullcontext()


def train(rank: int, world: int, model_name: str, data: Any, row: Row, steps: int, lr: float,
          iface: str, addresses: list[str]) -> dict[str, Any]:  # fmt: skip
    """One worker's run of ``row`` (collective): H warm-up steps, then ``steps`` timed ones.
    ``addresses[r]``: rank r's address (torchft's servers listen there)."""
    w = WORKLOADS[model_name]
    model = w.build(data)
    inner = torch.optim.SGD(model.parameters(), lr=lr)
    module, opt, diloco, ctx = wrap(model, row, inner, rank, world, addresses)
    with ctx:
        return _timed(rank, w, data, module, opt, diloco, row, steps, iface)


def _timed(rank: int, w: Any, data: Any, module: Any, opt: Any, diloco: Any, row: Row,
           steps: int, iface: str) -> dict[str, Any]:  # fmt: skip
    warm = max(2, row.h)
    batches = [w.batch(data, rank, s) for s in range(warm + steps)]
    losses: list[float] = []

    def step(i: int) -> None:
        x, y = batches[i]
        opt.zero_grad()
        loss = w.loss(module, x, y)
        loss.backward()
        opt.step()  # DiLoCo's and torchft's outer syncs run here (their step hooks)
        losses.append(float(loss.detach()))

    for i in range(warm):
        step(i)
    dist.barrier()
    outer0 = {k: getattr(diloco.stats, k) for k in (*_OUTER, "syncs")} if diloco else None
    tx0, t0 = tx_bytes(iface), time.perf_counter()
    for i in range(warm, warm + steps):
        step(i)
    seconds = time.perf_counter() - t0
    tx1 = tx_bytes(iface)
    dist.barrier()
    out: dict[str, Any] = {
        "seconds": seconds, "losses": losses,
        "tx_bytes": None if tx0 is None or tx1 is None else tx1 - tx0,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }  # fmt: skip
    if diloco is not None and outer0 is not None:
        s = diloco.stats
        syncs = max(1, s.syncs - outer0["syncs"])
        for field, key in _OUTER.items():
            out[key] = (getattr(s, field) - outer0[field]) / syncs
        out["payload_bytes_per_sync"] = s.sent_bytes / max(1, s.syncs)
    return out


def summarise(row: Row, per_rank: list[dict[str, Any]], batch: int, steps: int,
               loopback: bool) -> dict[str, Any]:  # fmt: skip
    """One row's figures from its ranks' results (``batch``: samples per rank per step;
    ``loopback``: the transmit counters are the machine's, so no bytes on the wire)."""
    seconds = max(r["seconds"] for r in per_rank)
    tx = [r["tx_bytes"] for r in per_rank]
    res: dict[str, Any] = {
        "row": row.name, **asdict(row),
        "samples_per_s": batch * steps * len(per_rank) / seconds,
        "step_ms": 1000 * seconds / steps,
        "wire_bytes_per_step": None if loopback or None in tx else sum(tx) / len(tx) / steps,
        "final_loss": sum(sum(r["losses"][-row.h:]) / row.h for r in per_rank) / len(per_rank),
        "max_rss_mb": max(r["max_rss_mb"] for r in per_rank),
    }  # fmt: skip
    for k in (*_OUTER.values(), "payload_bytes_per_sync"):
        if k in per_rank[0]:
            res[k] = sum(r[k] for r in per_rank) / len(per_rank)
    return res


def cpu_bound(row: dict[str, Any], step_s: float) -> float:
    """The utilisation a DiLoCo ``row`` could reach on an infinitely fast link: per period of H
    inner steps of ``step_s`` seconds (compute-only), each of its fragments' syncs still takes
    the loop's own time to encode, decode and step (its measured seconds, waits excluded)."""
    cpu = row["outer_encode_s"] + row["outer_decode_s"] + row["outer_step_s"]
    period = row["h"] * step_s
    return period / (period + row["fragments"] * cpu)


def run(workers: int, rate_mbit: float | None, model_name: str, rows: list[Row], steps: int,
        lr: float = 0.05, timeout: float = 900.0) -> dict[str, Any]:  # fmt: skip
    """Every row on one network; returns ``{"meta": ..., "rows": [...]}`` with ``utilisation``
    filled in against the compute-only row. ``steps`` must be a multiple of every H."""
    bad = [r.name for r in rows if steps % r.h]
    if bad:
        raise ValueError(f"steps={steps} is not a multiple of the H of {', '.join(bad)}")
    w = WORKLOADS[model_name]
    data = w.prepare()
    results = []
    with open_network(workers, rate_mbit) as net:
        loopback = isinstance(net, LoopbackNetwork)
        addresses = list(getattr(net, "addresses", ["127.0.0.1"] * workers))
        for row in rows:
            t = time.perf_counter()
            try:
                per_rank = run_in_network(net, train, model_name, data, row, steps, lr,
                                          net.iface, addresses, timeout=timeout)  # fmt: skip
            except Exception as exc:  # one broken row is a result, not a lost run
                log.error("diloco bench: %s failed: %s", row.name, exc)
                results.append({"row": row.name, "error": str(exc)[-2000:]})
                continue
            res = summarise(row, per_rank, w.batch_size, steps, loopback)
            res["wall_s"] = time.perf_counter() - t
            results.append(res)
            log.info("diloco bench: %s %.1f samples/s", row.name, res["samples_per_s"])
        network = getattr(net, "label", type(net).__name__)
    computes = [r["samples_per_s"] for r in results if r["row"] == "compute" and "error" not in r]
    for r in results:
        if computes and "samples_per_s" in r:
            r["utilisation"] = r["samples_per_s"] / max(computes)
            if "outer_step_s" in r:  # a DiLoCo row: what its own sync work allows
                r["cpu_bound"] = cpu_bound(r, w.batch_size * workers / max(computes))
    meta = {"workers": workers, "rate_mbit": rate_mbit, "model": model_name, "steps": steps,
            "network": str(network), "torch": torch.__version__, "threads": 1,
            "torchft": version() or "not installed"}  # fmt: skip
    return {"meta": meta, "rows": results}


def _table(result: dict[str, Any]) -> str:
    head = f"{'row':<30}{'samples/s':>10}{'util':>7}{'wire B/step':>13}{'sync s':>8}" \
           f"{'wait':>7}{'enc':>7}{'dec':>7}{'step':>7}{'cpu bnd':>8}{'loss':>8}{'RSS MB':>8}"  # fmt: skip
    lines = [head]
    for r in result["rows"]:
        if "error" in r:
            said = r["error"].strip().splitlines() or ["(no message)"]
            lines.append(f"{r['row']:<30} failed: {said[-1][:60]}")
            continue

        def f(k: str, fmt: str, r: dict[str, Any] = r) -> str:
            v = r.get(k)
            return "-" if v is None else format(v, fmt)

        lines.append(f"{r['row']:<30}{f('samples_per_s', '.1f'):>10}{f('utilisation', '.3f'):>7}"
                     f"{f('wire_bytes_per_step', '.3g'):>13}{f('outer_sync_s', '.3f'):>8}"
                     f"{f('outer_wait_s', '.3f'):>7}{f('outer_encode_s', '.3f'):>7}"
                     f"{f('outer_decode_s', '.3f'):>7}{f('outer_step_s', '.3f'):>7}"
                     f"{f('cpu_bound', '.3f'):>8}"
                     f"{f('final_loss', '.3f'):>8}"
                     f"{f('max_rss_mb', '.0f'):>8}")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hipress.bench.diloco", description=__doc__)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--rate", type=float, default=1000.0, help="Mbit/s per NIC (0: unshaped)")
    p.add_argument("--model", default="lstm-lm", choices=sorted(WORKLOADS))
    p.add_argument("--hs", default="4,16", help="inner steps per sync, comma-separated")
    p.add_argument("--algorithms", default="onebit,topk")
    p.add_argument("--streaming", default="", help="F,tau: Streaming DiLoCo rows too")
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    hs = tuple(int(h) for h in a.hs.split(","))
    ft = tuple(int(x) for x in a.streaming.split(",")) if a.streaming else None
    if ft is not None and len(ft) != 2:
        p.error("--streaming takes F,tau")
    rows = rows_for(hs, tuple(x for x in a.algorithms.split(",") if x),
                    None if ft is None else (ft[0], ft[1]))  # fmt: skip
    result = run(a.workers, a.rate or None, a.model, rows, a.steps)
    print(_table(result))
    if a.out is not None:
        a.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
