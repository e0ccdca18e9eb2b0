"""The checks of ``hipress selftest`` that need a process group (it runs them under ``torchrun``):
CaSync as a DDP hook, and :mod:`hipress.fsdp`'s compressed reduce-scatter.

Every compressed check records what CaSync or hipress.fsdp really compressed, read back from the
state after the run (``compressed``: tensors or FSDP units), in :attr:`Report.figures
<hipress.selftest_report.Report.figures>`, and fails when that is nothing: a compressed check that
compressed nothing has checked nothing. ``min_compress_numel`` (default: CaSync's and
hipress.fsdp's own threshold) is the size under which a tensor or unit stays uncompressed; the
models here hold tensors above the default.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from hipress.selftest_report import Report

if TYPE_CHECKING:
    from hipress.casync import CaSyncState

__all__ = ["fsdp_checks", "training_checks"]

STEPS = 6
LOSS_SLACK = 0.25  # how far a compressed step's loss may be from plain DDP's / FSDP2's


def _what() -> str:
    dev = "cuda" if dist.get_backend() == "nccl" else "cpu"
    world = dist.get_world_size()
    return f"{dist.get_backend()} on {dev}, {world} rank{'s' if world > 1 else ''}"


def _model(device: torch.device, head: bool = True) -> nn.Sequential:
    """Two weights of 65536 elements (CaSync's and hipress.fsdp's default threshold) and, with
    ``head``, a small last layer: CaSync's default rule compresses 2 of its 6 tensors."""
    torch.manual_seed(0)
    layers = [nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 64)]
    if head:
        layers += [nn.ReLU(), nn.Linear(64, 10)]
    return nn.Sequential(*layers).to(device)


def _batches(device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(100 + dist.get_rank())
    return [(torch.randn(32, 64, generator=gen).to(device),
             torch.randint(0, 10, (32,), generator=gen).to(device)) for _ in range(STEPS)]  # fmt: skip


def _near(what: str, got: list[float], plain: list[float], baseline: str) -> None:
    if not all(abs(a - b) < LOSS_SLACK for a, b in zip(plain, got, strict=True)):
        raise AssertionError(f"{what}: losses {got} drift from {baseline}'s {plain}")


def _nothing(what: str, figures: dict[str, Any], min_compress_numel: int | None,
             of: str = "tensor") -> None:  # fmt: skip
    """Fail a compressed check whose figures say it compressed nothing."""
    if figures.get("compressed", 0) < 1:
        limit = "the default" if min_compress_numel is None else f"{min_compress_numel}"
        raise AssertionError(
            f"{what} compressed nothing (no {of} compressed; threshold min_compress_numel "
            f"{limit}), so this check checked no compression"
        )


# ---------------------------------------------------------------- CaSync over DDP


def casync_figures(state: CaSyncState) -> dict[str, Any]:
    """What ``state`` ran, read back after training: ``compressed`` (its plan's compressed
    tensors), ``tensors``, ``steps`` (closed by its stats) and ``sent_ratio`` (bytes this rank
    sent over the bytes of the gradients, mean of the steps)."""
    entries = state.plan.entries
    mean = state.stats.mean()
    return {"compressed": sum(e.compress for e in entries), "tensors": len(entries),
            "steps": len(state.stats.steps),
            "sent_ratio": round(mean.get("ratio", 1.0), 4)}  # fmt: skip


def training_checks(report: Report, device: torch.device,
                    min_compress_numel: int | None = None) -> None:  # fmt: skip
    """CaSync as a DDP hook over the default group: uncompressed equals plain DDP bit for bit;
    onebit and terngrad (compressed for real, see the module doc) stay near plain DDP."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from hipress.casync import register
    from hipress.core.rule import DefaultRule

    rule = None if min_compress_numel is None else DefaultRule(min_compress_numel)

    def train(hook: str | None) -> tuple[list[float], list[torch.Tensor], CaSyncState | None]:
        m = _model(device)
        ddp = DDP(m, device_ids=[device.index] if device.type == "cuda" else None)
        state = None
        if hook is not None:
            alg = None if hook == "none" else hook
            state = register(ddp, alg, seed=1, log_every=0, rule=rule)
        opt = torch.optim.SGD(m.parameters(), lr=0.05)
        losses, grads = [], []
        for xb, yb in _batches(device):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(ddp(xb), yb)
            loss.backward()
            grads.append(torch.cat([p.grad.reshape(-1) for p in m.parameters()]).cpu())
            opt.step()
            losses.append(float(loss.detach()))
        return losses, grads, state

    def uncompressed() -> None:
        _, plain, _ = train(None)
        _, ours, _ = train("none")
        if not all(torch.equal(a, b) for a, b in zip(plain, ours, strict=True)):
            raise AssertionError("uncompressed CaSync gradients differ from DDP's")

    plain: list[float] = []

    def compressed(alg: str, name: str) -> None:
        if not plain:
            plain.extend(train(None)[0])
        got, _, state = train(alg)
        assert state is not None
        figures = report.figures[name] = casync_figures(state)
        _nothing(alg, figures, min_compress_numel)
        if figures["steps"] != STEPS or figures["sent_ratio"] >= 1:
            raise AssertionError(f"{alg}: CaSync's stats do not show compressed steps: {figures}")
        _near(alg, got, plain, "DDP")

    what = _what()
    report.check(f"training ({what}): uncompressed = DDP bit for bit", uncompressed)
    for alg in ("onebit", "terngrad"):
        name = f"training ({what}): {alg} near DDP"
        report.check(name, lambda a=alg, n=name: compressed(a, n))


# ---------------------------------------------------------------- hipress.fsdp


def _rows(world: int) -> int:
    """Elements per rank of the direct check's unit: odd (kernel tails), and few enough that
    the reference model, which encodes every rank's every row on each rank's CPU (world^2
    rows a step), stays quick."""
    return max(257, 16411 // world**2) | 1


def direct_reduce_scatter(device: torch.device, alg_name: str, feedback: str, numel: int,
                          compress: bool, steps: int = 3) -> dict[str, Any]:  # fmt: skip
    """One unit's :class:`~hipress.fsdp.CompressedReduceScatter` called directly on the default
    group, ``steps`` times (one input holding a NaN), each rank's output against
    :class:`~hipress.fsdp.reference.ReferenceReduceScatter` bit for bit. Returns its figures
    (``compressed``: 1 if it ran compressed, ``compressed_calls``); raises on a difference."""
    from hipress.compll import load
    from hipress.fsdp import CompressedReduceScatter
    from hipress.fsdp.feedback import resolve_feedback
    from hipress.fsdp.reference import ReferenceReduceScatter

    world, rank = dist.get_world_size(), dist.get_rank()
    alg = load(alg_name)
    fb = resolve_feedback(alg, feedback)
    rs = CompressedReduceScatter("unit", alg, fb, numel, world, rank, device, compress=compress)
    ref = ReferenceReduceScatter("unit", load(alg_name, backend="reference"), fb, numel, world)
    outs, wants = [], []
    for step in range(steps):
        xs = []
        for r in range(world):  # every rank's input, so each rank can run the reference
            x = torch.randint(-64, 64, (numel,), generator=torch.Generator().manual_seed(
                1000 * step + r)).float() / 8  # fmt: skip
            if step == 1 and r == world - 1:
                x[77] = float("nan")
            xs.append(x)
        out = torch.empty(numel // world, device=device)
        rs(out, xs[rank].to(device), dist.group.WORLD, dist.ReduceOp.AVG)
        outs.append(out.cpu())
        wants.append(ref.step(xs, float(world))[rank])
    figures = {"compressed": int(rs.stats.compressed_calls > 0),
               "compressed_calls": rs.stats.compressed_calls, "elements": numel}  # fmt: skip
    if not rs.stats.compressed_calls:
        return figures
    for step, (got, want) in enumerate(zip(outs, wants, strict=True)):
        same = (got == want) & (got.signbit() == want.signbit()) | (got.isnan() & want.isnan())
        if not bool(same.all()):
            raise AssertionError(f"{alg_name}/{fb} step {step}: {int((~same).sum())} of "
                                 f"{got.numel()} elements differ from the reference")  # fmt: skip
    return figures


def fsdp_checks(report: Report, device: torch.device,
                min_compress_numel: int | None = None) -> None:  # fmt: skip
    """hipress.fsdp's compressed reduce-scatter on the default group: called directly against
    the reference (any world size: FSDP2 never calls a custom reduce-scatter on one rank), and,
    on several ranks, through ``fully_shard`` + :func:`hipress.fsdp.register` training near
    plain FSDP2 with every unit's compressed path run."""
    world = dist.get_world_size()
    what = _what()
    numel = world * _rows(world)
    threshold = (1 << 16) if min_compress_numel is None else min_compress_numel
    # the direct unit is small (the reference is slow): it compresses unless told a threshold
    compress = min_compress_numel is None or numel >= min_compress_numel

    for alg, fb in (("onebit", "auto"), ("terngrad", "int8")):
        name = f"FSDP ({what}): compressed reduce-scatter {alg}/{fb} = reference"

        def direct(alg: str = alg, fb: str = fb, name: str = name) -> None:
            figures = report.figures[name] = direct_reduce_scatter(device, alg, fb, numel,
                                                                   compress)  # fmt: skip
            _nothing(f"{alg}/{fb}", figures, min_compress_numel, "reduce-scatter")

        report.check(name, direct)

    name = f"FSDP ({what}): onebit through fully_shard + register near FSDP2"
    if world == 1:
        report.checks[name] = ("skipped: FSDP2 calls no reduce-scatter on one rank (the "
                               "checks above call it directly)")  # fmt: skip
        return

    def train(compressed: bool) -> tuple[list[float], Any]:
        from torch.distributed.fsdp import fully_shard

        import hipress.fsdp

        m = _model(device, head=False)  # both units above the default threshold: all compress
        for layer in m:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(m)
        comp = None
        if compressed:
            comp = hipress.fsdp.register(m, "onebit", min_compress_numel=threshold)
        opt = torch.optim.SGD(m.parameters(), lr=0.05)
        losses = []
        for xb, yb in _batches(device):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(m(xb), yb)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        return losses, comp

    def through_register() -> None:
        plain, _ = train(False)
        got, comp = train(True)
        stats = comp.stats()
        per = stats["units"]
        figures = report.figures[name] = {
            "compressed": sum(s["compressed_calls"] > 0 for s in per.values()),
            "units": len(per), "compressed_calls": stats["compressed_calls"],
            "sent_ratio": round(stats["sent_bytes"] / max(stats["raw_bytes"], 1), 4),
        }  # fmt: skip
        _nothing("onebit through register", figures, min_compress_numel, "unit")
        unrun = [k for k, u in comp.units.items() if u.compress and not u.stats.compressed_calls]
        if unrun:
            raise AssertionError(f"units {unrun} are planned compressed but never ran so")
        _near("onebit through register", got, plain, "FSDP2")

    report.check(name, through_register)
