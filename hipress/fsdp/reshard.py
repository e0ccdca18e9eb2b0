"""``hipress.fsdp`` error feedback saved at N ranks, loaded at M: sum-preserving redistribution.

What is kept. Every rank encodes all N rows of a unit's padded reduce-scatter input (row j is
bound for rank j), so every rank keeps a state for every element of the unit: a residual over
the unit's *whole* flat gradient, not over its shard. The next compressed reduce-scatter hands
the owner of element ``i`` the sum over ranks of ``g_r[i] + e_r[i]``; what the residuals add
there is ``S[i] = sum_r e_r[i]``. Resharding keeps ``S[i]`` for every element ``i`` of every
compressed unit's gradient (its parameters flattened in FSDP's order, without padding): at M
ranks each rank's residual for ``i`` is ``S[i] / M`` (formed in float64, rounded once to the
storage precision: exact to one float32 rounding with ``"fp32"``, to bfloat16's or int8's
rounding with ``"bf16"`` or ``"int8"``). dgc's momentum is moved the same way. What sat in
padding positions belongs to no parameter (FSDP2 drops those outputs) and is not carried; new
padding starts at zero. Each state keeps its own random stream, at the step the saved states had
reached.

How. The row layout depends on the world size: FSDP2 pads each parameter's dim 0 to a multiple
of the world size and cuts the rows with ``torch._chunk_cat``. :func:`unit_positions` replays
that cut on index tensors at N and at M. ``torch.distributed.checkpoint`` hands each rank the
entries its own ``state_dict`` names: at M ranks, rank r < N gets old rank r's entry and rank 0
the entries of ranks M..N-1 (its spare keys), so together the ranks hold every old entry once.
Each rank sums the masses it holds into the unit's element space, one all-reduce per unit adds
them up, and every rank writes its share. All checks (entries, damage, sizes) end in one
agreement, so a refusal is an :class:`FsdpError` on every rank and nothing is restored.

What cannot be resharded, refused with an :class:`FsdpError` that says what to do: replica
hooks (``replicate_group``) and units whose shard group is not the whole world (2-D meshes), an
algorithm whose residual hipress cannot read (a user's own algorithm with state), and a
checkpoint that does not hold every old rank's entry.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from hipress.codec.residual import mass_of, with_mass
from hipress.core.layout import ChunkLayout, layout_tensor
from hipress.core.plan import Strategy, TensorPlan
from hipress.core.torchcompat import fsdp_param_groups
from hipress.fsdp.errors import FsdpError
from hipress.fsdp.feedback import ChunkCoder, Residual, ResidualCoder

__all__ = ["load_resharded", "unit_positions"]

EXTERNAL = "external"  # the mass name of an external residual (feedback fp32/bf16/int8)


def unit_positions(shapes: list[tuple[torch.Size, int]], world_size: int) -> torch.Tensor:
    """For every element of a unit's padded reduce-scatter input at ``world_size`` ranks, the
    index of the gradient element it carries (the parameters of ``shapes``, ``(size, shard
    dim)`` in FSDP order, flattened one after another), -1 for padding; as FSDP2 lays it out.
    Raises :class:`FsdpError` where FSDP2 itself could not shard a parameter."""
    views, base = [], 0
    for size, dim in shapes:
        n = size.numel()
        t = torch.arange(base + 1, base + 1 + n, dtype=torch.int64).view(size)
        if dim != 0:
            if size[dim] % world_size:
                raise FsdpError(f"a parameter of size {tuple(size)} sharded on dim {dim} does "
                                f"not split evenly into {world_size} ranks")  # fmt: skip
            t = torch.cat(torch.chunk(t, world_size, dim=dim), dim=0)
        views.append(t)
        base += n
    rows = sum(-(-v.size(0) // world_size) * (v.numel() // max(v.size(0), 1)) for v in views)
    out = torch.zeros(world_size, rows, dtype=torch.int64)
    torch._chunk_cat(views, 0, world_size, out=out)
    return out.view(-1) - 1


def _shapes(module: Any) -> list[tuple[torch.Size, int]]:
    (group,) = fsdp_param_groups(module._get_fsdp_state())
    return [(torch.Size(fp._orig_size), int(fp.fsdp_placement.dim)) for fp in group.fsdp_params]


def _mass_names(comp: Any, coder: ChunkCoder) -> list[str]:
    """The masses a chunk of this run holds (the same on every rank)."""
    names = sorted(_alg_mass(comp, coder.state.state_dict(), "this run"))
    return names + ([EXTERNAL] if isinstance(coder, ResidualCoder) else [])


def _alg_mass(comp: Any, alg_sd: Any, where: str) -> dict[str, torch.Tensor]:
    tensors = alg_sd.get("tensors") if isinstance(alg_sd, Mapping) else None
    mass = mass_of(comp.algorithm.name, dict(comp.algorithm.params), tensors or {})
    if mass is None:
        raise FsdpError(
            f"{where}: hipress cannot read {comp.algorithm.name}'s residual out of its state, so "
            "its error feedback cannot move to another number of ranks; resume on the number "
            "of ranks it was saved at, or leave hipress's state out of what you load (error "
            "feedback then starts afresh)"
        )
    return mass


def _chunk_mass(
    comp: Any, coder: ChunkCoder, saved: Any, n: int, where: str
) -> dict[str, torch.Tensor]:
    """The masses of one saved chunk state of ``n`` elements (float32 vectors, by name)."""
    if not isinstance(saved, Mapping) or not isinstance(saved.get("alg"), Mapping):
        raise FsdpError(f"{where} is malformed")
    mass = dict(_alg_mass(comp, saved["alg"], where))
    if isinstance(coder, ResidualCoder):
        got = saved.get("residual")
        own = coder.residual
        if not isinstance(got, Mapping) or set(got) != set(own.tensors):
            raise FsdpError(f"{where}: its residual was saved with another feedback option")
        res = Residual(n, own.dtype, torch.device("cpu"))
        res.tensors = {k: v.cpu() for k, v in got.items()}
        mass[EXTERNAL] = torch.zeros(n, dtype=torch.float32)
        res.add_into(mass[EXTERNAL])
    return mass


def _held(comp: Any, saved_ws: int) -> list[int]:
    """The saved ranks whose entries this rank's ``state_dict`` names (see the module doc)."""
    mine = [comp.rank] if comp.rank < saved_ws else []
    if comp.rank == 0:
        mine += list(range(comp.world_size, saved_ws))
    return mine


def _check_possible(comp: Any) -> None:
    if comp.replicas:
        raise FsdpError(
            "the checkpoint was saved at another number of ranks, and error feedback with "
            "replicate_group cannot be resharded; resume on the number of ranks it was saved "
            "at, or leave hipress's state out of what you load (error feedback then starts "
            "afresh)"
        )
    for name, u in comp.units.items():
        if u.world_size != comp.world_size:
            raise FsdpError(
                f"the checkpoint was saved at another number of ranks, and unit {name} shards "
                f"over {u.world_size} of {comp.world_size} ranks (a 2-D mesh): only units "
                "sharded over every rank can be resharded; resume on the number of ranks it "
                "was saved at, or leave hipress's state out of what you load"
            )


def _old_layout(comp: Any, name: str, positions: torch.Tensor, saved_ws: int) -> ChunkLayout:
    entry = TensorPlan(name, positions.numel(), compress=True, strategy=Strategy.PS, partitions=1)
    (layout,) = layout_tensor(entry, saved_ws, comp.algorithm.payload_nbytes)
    return layout


def _local_sums(
    comp: Any, entries: dict[int, Mapping[str, Any]], saved_ws: int
) -> tuple[dict[str, dict[str, torch.Tensor]], int]:
    """Per compressed unit, per mass name, the masses of the held ``entries`` summed into the
    unit's element space (float64); and the highest step of their states."""
    sums: dict[str, dict[str, torch.Tensor]] = {}
    step = 0
    for name, u in comp.units.items():
        if not u.coders:
            continue
        shapes = _shapes(comp._modules[name])
        old = unit_positions(shapes, saved_ws)
        total = sum(s.numel() for s, _ in shapes)
        layout = _old_layout(comp, name, old, saved_ws)
        acc = {m: torch.zeros(total, dtype=torch.float64)
               for m in _mass_names(comp, u.coders[0])}  # fmt: skip
        for r, entry in entries.items():
            chunks = entry[name].get("chunks") if isinstance(entry[name], Mapping) else None
            if isinstance(chunks, Mapping) and not chunks:
                continue  # (the unit was too small to compress at that world size: no mass)
            if not isinstance(chunks, Mapping) or set(chunks) != {str(j) for j in
                                                                  range(saved_ws)}:  # fmt: skip
                raise FsdpError(f"the checkpoint's entry rank{r} does not hold {saved_ws} chunk "
                                f"states for unit {name}")  # fmt: skip
            for j in range(saved_ws):
                where = f"the checkpoint's entry rank{r}, unit {name} chunk {j}"
                start, stop = layout.shard_span(j)
                mass = _chunk_mass(comp, u.coders[0], chunks[str(j)], stop - start, where)
                idx = old[start:stop]
                keep = idx >= 0
                for m, acc_m in acc.items():
                    v = mass.get(m)
                    if v is None or v.numel() != stop - start:
                        raise FsdpError(f"{where} does not fit unit {name} at {saved_ws} ranks")
                    acc_m.index_add_(0, idx[keep], v.reshape(-1).double()[keep])
                step = max(step, int(chunks[str(j)]["alg"].get("step", 0)))
        sums[name] = acc
    return sums, step


def _agree(comp: Any, error: FsdpError | None, held: int, saved_ws: int, device: Any) -> None:
    """Raise the same kind of :class:`FsdpError` on every rank if any rank refused its entries
    or the ranks together do not hold every saved rank's entry."""
    flags = torch.tensor([int(error is not None), held], dtype=torch.int64, device=device)
    dist.all_reduce(flags)
    if error is not None:
        raise error
    if int(flags[0]):
        raise FsdpError(
            f"cannot reshard the checkpoint (world_size {saved_ws} -> {comp.world_size}): "
            "another rank refused its entries of it (its error says why); nothing was restored"
        )
    if int(flags[1]) != saved_ws:
        raise FsdpError(
            f"the checkpoint was saved at {saved_ws} ranks, and this run of "
            f"{comp.world_size} ranks found {int(flags[1])} of their entries; load it with "
            "torch.distributed.checkpoint on every rank (each rank's state_dict names the "
            "entries it takes)"
        )


def load_resharded(comp: Any, sd: Mapping[str, Any]) -> None:
    """Restore ``comp`` (an :class:`~hipress.fsdp.FsdpCompression`) from ``sd``, a state dict
    of the same configuration saved at another number of ranks, keeping the sums over ranks
    (module doc). A collective: every rank calls it (``dcp.load`` does)."""
    _check_possible(comp)
    saved_ws = int(sd["world_size"])
    device = next(iter(comp.units.values())).device
    error: FsdpError | None = None
    held = _held(comp, saved_ws)
    try:
        entries = {r: comp._entry(sd.get(f"rank{r}"), r) for r in held}
        sums, step = _local_sums(comp, entries, saved_ws)
    except FsdpError as exc:
        head = f"cannot reshard the checkpoint (world_size {saved_ws} -> {comp.world_size})"
        error, sums, step = FsdpError(f"{head}: {exc}"), {}, 0
    _agree(comp, error, len(held), saved_ws, device)
    top = torch.tensor([step], dtype=torch.int64, device=device)
    dist.all_reduce(top, op=dist.ReduceOp.MAX)
    for name, u in comp.units.items():
        if u.coders:
            _write_unit(comp, name, sums[name], int(top[0]), device)


def _write_unit(
    comp: Any, name: str, sums: dict[str, torch.Tensor], step: int, device: Any
) -> None:
    """Add the unit's masses over every rank and write this rank's share into its chunks."""
    u = comp.units[name]
    for m in sorted(sums):
        total = sums[m].to(device)
        dist.all_reduce(total)
        sums[m] = total.cpu()
    new = unit_positions(_shapes(comp._modules[name]), comp.world_size)
    if new.numel() != u.numel or u.layout is None:
        raise FsdpError(f"unit {name}: its parameters do not lay out to its {u.numel} elements")
    for j, coder in enumerate(u.coders):
        start, stop = u.layout.shard_span(j)
        idx = new[start:stop]
        keep = idx >= 0
        mass = {}
        for m, total in sums.items():
            v = torch.zeros(stop - start, dtype=torch.float64)
            v[keep] = total[idx[keep]] / comp.world_size
            mass[m] = v.float()
        _write_chunk(comp, coder, mass, step)


def _write_chunk(comp: Any, coder: ChunkCoder, mass: dict[str, torch.Tensor], step: int) -> None:
    sd = coder.state.state_dict()
    own = {m: v for m, v in mass.items() if m != EXTERNAL}
    if sd.get("tensors"):
        sd["tensors"] = with_mass(comp.algorithm.name, sd["tensors"], own)
    sd["step"] = step
    coder.state.load_state_dict(sd)
    if isinstance(coder, ResidualCoder):
        device = next(iter(coder.residual.tensors.values())).device
        coder.residual.store(mass[EXTERNAL].to(device))
