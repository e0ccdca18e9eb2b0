"""Which optimizers a compression algorithm can train with: :func:`check_optimizer` (given the
optimizer) and :func:`watch_optimizers` (at the first ``step()`` of any optimizer of the
model's parameters). A refusal is a :class:`~hipress.codec.errors.CaSyncError` saying what to
change.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from hipress.codec.errors import CaSyncError
from hipress.core.compression import CompressionAlgorithm, compresses

__all__ = [
    "ADAPTIVE_STEP_MIN",
    "VARIANCE_MAX",
    "adaptive_step",
    "check_optimizer",
    "relative_variance",
    "watch_optimizers",
]


def _momentum(optimizer: torch.optim.Optimizer) -> float:
    """The largest momentum among ``optimizer``'s parameter groups: SGD's and RMSprop's
    ``momentum``, or the first beta of the Adam family; 0 if it keeps none."""
    found = 0.0
    for group in optimizer.param_groups:
        m = group.get("momentum", 0.0)
        betas = group.get("betas")
        if isinstance(betas, tuple | list) and betas:
            m = max(float(m or 0.0), float(betas[0]))
        found = max(found, float(m or 0.0))
    return found


def _own_momentum(alg: CompressionAlgorithm) -> float:
    """The momentum an algorithm applies itself (dgc's momentum correction), 0 if none."""
    return float(dict(getattr(alg, "params", {}) or {}).get("momentum", 0.0))


# an unbiased compressor whose error is this many times the gradient's energy or more (randomk
# at 1% without memory: n/k - 1 = 99) needs a learning rate about that much smaller with a
# plain (non-adaptive) optimizer
VARIANCE_MAX = 8.0


def _probe(alg: CompressionAlgorithm, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A heavy-tailed random ``g`` of ``n`` elements (Gaussians with log-normal scales, like
    gradients) and what one step of ``alg`` (fresh state) delivers for it. A named algorithm runs
    on the reference backend, on the CPU."""
    probe: Any = alg
    program = getattr(alg, "program", None)
    if program is not None:
        from hipress.compll import Algorithm
        from hipress.compll.backends.base import ReferenceBackend

        probe = Algorithm(program, ReferenceBackend(program))
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(n, generator=gen) * torch.randn(n, generator=gen).exp()
    return g, probe.decode(probe.encode(g, probe.init_state(n, seed=seed + 1)), n)


def relative_variance(alg: CompressionAlgorithm, n: int = 1 << 12, samples: int = 2) -> float:
    """``E ||decode(encode(g)) - g||^2 / ||g||^2`` of one step of ``alg`` (fresh state) over a
    few heavy-tailed random ``g`` of ``n`` elements (a compressor whose error follows the
    largest element shows it)."""
    err = energy = 0.0
    for t in range(samples):
        g, y = _probe(alg, n, t)
        err += float((y - g).square().sum())
        energy += float(g.square().sum())
    return err / energy


# the share of an adaptive optimizer's progress (adaptive_step) below which a sparsifier that
# chooses at random, or one that applies momentum itself, is refused with the Adam family. With
# AdamW, the LSTM LM of `hipress bench robustness --task lm` ends 1.20x DDP's loss with randomk
# at 1% (0.10), 1.05x at 10% (0.32); 1.11x with dgc (0.07), 1.09x with dgc without its
# momentum, 1.01x with dgc at s_percent 0.01 (0.17)
ADAPTIVE_STEP_MIN = 0.15


def _steady_share(a: torch.Tensor, density: float) -> float:
    """Adam's share for a sparsifier that sends the largest accumulated elements: with error
    feedback and a steady gradient ``a`` (magnitudes), element i is sent once every
    ``max(1, t / a_i)`` steps, ``t`` such that ``density * n`` are sent per step on average."""
    target = density * a.numel()
    lo, hi = 0.0, float(a.sum()) / max(target, 1e-12)
    for _ in range(50):  # (bisection on the threshold: the sent count falls as it rises)
        t = (lo + hi) / 2
        lo, hi = (t, hi) if float((a / t).clamp(max=1.0).sum()) > target else (lo, t)
    p = (a / hi).clamp(max=1.0)
    return float((a * p.sqrt()).sum() / a.sum())


def adaptive_step(alg: CompressionAlgorithm, n: int = 1 << 12) -> tuple[float, float, bool]:
    """``(density, share, by_size)``: the fraction of elements one step of ``alg`` sends (on the
    probe of :func:`relative_variance`), the share of an adaptive optimizer's progress that is
    left when it trains on what ``alg`` delivers instead of on the gradient, and whether ``alg``
    chooses the elements it sends by their size (rather than at random).

    An error-feedback sparsifier sends an element once every ``1 / p`` steps, holding those
    steps' sum; the Adam family divides each element's step by the RMS of what it receives,
    which pulses raise by ``sqrt(1 / p)``, so the element moves ``sqrt(p)`` of its uncompressed
    distance. A sparsifier that picks elements at random sends each with ``p = density``; one
    that picks the largest sends large elements more often (:func:`_steady_share`); between the
    two, by how much of the gradient's energy its one step sent. An algorithm that sends half
    of the elements or more is not a sparsifier: share 1.0."""
    g, y = _probe(alg, n, 0)
    sent = y != 0
    density = float(sent.float().mean())
    if density >= 0.5:
        return density, 1.0, True
    energy = g.square()
    top = float(energy.sort(descending=True).values[: max(1, int(sent.sum()))].sum())
    blind = density * float(energy.sum())  # what a random choice sends on average
    how = min(1.0, max(0.0, (float(energy[sent].sum()) - blind) / max(top - blind, 1e-30)))
    random_share = density**0.5
    share = random_share + how * (_steady_share(g.abs(), density) - random_share)
    return density, share, how >= 0.5


def _adaptive(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` divides its step by a running scale of the gradient (the Adam
    family, with ``betas``): then its step does not grow with the gradient's size."""
    return all("betas" in g for g in optimizer.param_groups)


def check_optimizer(alg: CompressionAlgorithm, optimizer: torch.optim.Optimizer) -> None:
    """Raise :class:`CaSyncError` if ``alg`` cannot train with ``optimizer`` at the learning
    rate it would use uncompressed, saying what to change. With a plain (non-adaptive)
    optimizer such as SGD:

    - an algorithm that applies momentum itself (dgc's momentum correction) sends the
      accumulated velocity; heavy-ball momentum on top (SGD's ``momentum``) multiplies the
      step by another ``1 / (1 - momentum)`` and diverges;
    - an unbiased compressor without error feedback whose error is :data:`VARIANCE_MAX` or
      more times the gradient's energy (randomk with ``memory=False``: about ``n / k``) needs
      a learning rate about that much smaller.

    With the Adam family (which normalises its step, so the size of what it receives does not
    matter), a sparsifier that leaves less than :data:`ADAPTIVE_STEP_MIN` of the optimizer's
    progress (:func:`adaptive_step`) trains too slowly if it chooses the elements it sends at
    random (randomk at 1%: the large ones wait as long as the rest), or if it applies momentum
    itself (dgc at 0.1%: its momentum's delay adds to that of Adam's first moment). One that
    chooses the largest elements and keeps no momentum (topk, graddrop) sends what matters most
    at once and trains."""
    if not compresses(alg):
        return
    kind = type(optimizer).__name__
    own = _own_momentum(alg)
    if _adaptive(optimizer):
        density, share, by_size = adaptive_step(alg)
        if share >= ADAPTIVE_STEP_MIN or (by_size and own == 0.0):
            return
        what = (f"applies momentum itself (momentum={own:g}), whose delay adds to {kind}'s "
                "own, and sends" if by_size else "sends a random")  # fmt: skip
        fix = (f"SGD without momentum ({alg.name} applies its own), {alg.name} with "
               "params={'momentum': 0.0} (the optimizer's momentum then serves)" if by_size
               else "topk (which sends the largest elements)")  # fmt: skip
        if not by_size and relative_variance(alg) < VARIANCE_MAX:  # (SGD takes it)
            fix = f"SGD, {fix}"
        raise CaSyncError(
            f"{alg.name} {dict(alg.params)} {what} {100 * density:.2g}% of the elements per "
            f"step, each held back until it is sent: {kind} divides every element's step by "
            f"the size of what it receives, so these pulses leave about {share:.2f} of its "
            f"progress, too little (under {ADAPTIVE_STEP_MIN:g}) for {kind} to train. Use "
            f"{fix}, or {alg.name} with parameters that send more elements per step"
        )
    theirs = _momentum(optimizer)
    if own > 0.0 and theirs > 0.0:
        raise CaSyncError(
            f"{alg.name} applies momentum itself (momentum={own:g}) and {kind} applies its "
            f"own (momentum={theirs:g}): the two compound and training diverges. Use {kind} "
            f"without momentum (momentum=0), or {alg.name} with params={{'momentum': 0.0}}"
        )
    # (an error-feedback algorithm keeps what it does not send: its one-step error stays near
    # the gradient's energy or below, so only an unbiased estimate without it reaches this)
    omega = relative_variance(alg)
    if omega >= VARIANCE_MAX:
        raise CaSyncError(
            f"{alg.name} {dict(alg.params)} sends an unbiased estimate with about {omega:.0f} "
            f"times the gradient's variance and no error feedback: with {kind} at a learning "
            "rate set for the exact gradient, training diverges. Use an error-feedback "
            "algorithm (randomk with memory=True, its default; topk; graddrop) or an adaptive "
            "optimizer (Adam, AdamW)"
        )


# Handles of watches that have done their check. torch iterates its global pre-hooks while
# calling them, so a hook cannot remove itself (a second watch in the same process would see
# "OrderedDict mutated during iteration"); finished handles are removed at the next watch.
_FINISHED: list[Any] = []


def watch_optimizers(alg: CompressionAlgorithm, params: Sequence[torch.Tensor]) -> None:
    """Run :func:`check_optimizer` at the first ``step()`` of any optimizer that updates one
    of ``params`` (a one-shot global step pre-hook of ``torch.optim``: after that check, or
    once the parameters are gone, it does nothing and is removed at the next watch)."""
    while _FINISHED:
        _FINISHED.pop().remove()
    if not compresses(alg):
        return
    refs = [weakref.ref(p) for p in params]
    done = [False]

    def finish() -> None:
        done[0] = True
        _FINISHED.append(handle)

    def hook(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if done[0]:
            return
        mine = {id(p) for p in (r() for r in refs) if p is not None}
        if not mine:
            finish()
            return
        if any(id(p) in mine for g in optimizer.param_groups for p in g["params"]):
            finish()
            check_optimizer(alg, optimizer)

    handle = register_optimizer_step_pre_hook(hook)
