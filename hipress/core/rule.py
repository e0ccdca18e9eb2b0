"""The plan rule used when no plan is given: :class:`DefaultRule`.

Tensors of fewer than ``min_compress_numel`` elements are not compressed and go, batched, into one
allreduce per bucket; larger ones are compressed with the PS strategy (compressed scatter-reduce +
all-gather; between two workers the all-gather) in ``ceil(numel / partition_numel)`` partitions,
at most ``max_partitions``. The DDP hook, Horovod and FSDP read it alike.

Before sizes and costs, :class:`Selection` says which tensors may carry a lossy codec at all:
``exclude=``/``include=`` name patterns, a shape rule, and the defaults that keep embeddings and
tensors of fewer than two dimensions plain. Every entry point (``hipress.casync.register``,
``hipress.fsdp.register``, the Horovod optimizer, the Lightning and Accelerate helpers,
``hipress plan``) takes the same three arguments.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from difflib import get_close_matches
from fnmatch import fnmatchcase
from typing import Any

from hipress.core.plan import Strategy, TensorPlan

__all__ = ["SHAPE_WORDS", "DefaultRule", "Selection", "Shapes", "embedding_names", "named_shapes"]


@dataclass(frozen=True)
class DefaultRule:
    """The plan used when none is given.

    Fields:
        min_compress_numel: tensors with fewer elements are sent uncompressed (batched).
        partition_numel: target elements per pipelined partition of a compressed tensor.
        max_partitions: upper bound on K.
    """

    min_compress_numel: int = 1 << 16
    partition_numel: int = 1 << 22
    max_partitions: int = 4

    def __post_init__(self) -> None:
        if self.min_compress_numel < 1:
            raise ValueError(f"min_compress_numel must be >= 1, got {self.min_compress_numel}")
        if self.partition_numel < 1:
            raise ValueError(f"partition_numel must be >= 1, got {self.partition_numel}")
        if self.max_partitions < 1:
            raise ValueError(f"max_partitions must be >= 1, got {self.max_partitions}")

    def entry(self, name: str, numel: int, world_size: int) -> TensorPlan:
        """The decision for one tensor of ``numel`` elements among ``world_size`` workers."""
        if numel < max(self.min_compress_numel, world_size):
            return TensorPlan(name, numel, compress=False, strategy=Strategy.ALLREDUCE)
        parts = min(self.max_partitions, math.ceil(numel / self.partition_numel))
        parts = max(1, min(parts, numel // world_size))
        # two workers: the all-gather sends the bytes the PS sends, in one phase, with one
        # encode per element instead of two (and no re-compression error)
        strategy = Strategy.ALLGATHER if world_size == 2 else Strategy.PS
        return TensorPlan(name, numel, compress=True, strategy=strategy, partitions=parts)


# what ``shapes=`` takes: "all", "matrices" (exactly two dimensions), or a callable
# (name, shape) -> bool saying whether a tensor of that shape may be compressed
Shapes = str | Callable[[str, tuple[int, ...]], bool]
SHAPE_WORDS = ("all", "matrices")
# parameter names that are embeddings when no module says so: the module's own name (the part
# before ".weight") contains "emb" (embed, embedding, tok_embeddings, ...) or is GPT-2's wte/wpe
_EMBEDDING_NAME = re.compile(r"(?:^|\.)(?:[^.]*emb[^.]*|wte|wpe)\.weight$", re.IGNORECASE)


def _patterns(value: Any, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    items = (value,) if isinstance(value, str) else value
    try:
        out = tuple(items)
    except TypeError:
        out = None
    if out is None or not all(isinstance(p, str) and p for p in out):
        raise ValueError(
            f"{what} takes parameter name patterns (fnmatch: '*' matches dots too), a string or "
            f"a list of strings, e.g. {what}=['*.bias', 'wte.weight']; got {value!r}"
        )
    return out


@dataclass(frozen=True)
class Selection:
    """Which tensors may carry a lossy codec, before any plan looks at their sizes or costs.

    Fields:
        include: name patterns (:func:`fnmatch.fnmatchcase` on the names of
            ``named_parameters()``; ``*`` matches dots too) of tensors that may be compressed
            even where the rules below keep them plain.
        exclude: name patterns of tensors always kept plain (``exclude`` wins over ``include``).
        shapes: ``"all"``, ``"matrices"`` (tensors of exactly two dimensions) or a callable
            ``(name, shape) -> bool``: tensors it rejects are kept plain.
        embeddings: the names of the model's embedding weights (``nn.Embedding`` and
            ``nn.EmbeddingBag`` modules, :func:`embedding_names`), or None when no model was
            given: then a 2-D tensor named ``*emb*.weight``, ``wte.weight`` or ``wpe.weight``
            counts as one.

    Kept plain unless ``include`` names them: embeddings (a quantiser on a token embedding
    costs accuracy: its gradient is sparse and its rows rare) and tensors of fewer than two
    dimensions (biases, norms: small, and sensitive). "Plain" means no lossy codec; a lossless
    synchronisation is not a compression in this sense.
    """

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    shapes: Shapes = "all"
    embeddings: frozenset[str] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "include", _patterns(self.include, "include"))
        object.__setattr__(self, "exclude", _patterns(self.exclude, "exclude"))
        if not callable(self.shapes) and self.shapes not in SHAPE_WORDS:
            raise ValueError(
                f"shapes must be 'all', 'matrices' or a callable (name, shape) -> bool, got "
                f"{self.shapes!r}"
            )
        if self.embeddings is not None:
            object.__setattr__(self, "embeddings", frozenset(self.embeddings))

    def is_embedding(self, name: str, shape: tuple[int, ...] | None) -> bool:
        """Whether ``name`` is an embedding weight (by module type when known, else by name)."""
        if self.embeddings is not None:
            return name in self.embeddings
        return (shape is None or len(shape) == 2) and bool(_EMBEDDING_NAME.search(name))

    def reason(self, name: str, shape: tuple[int, ...] | None, implicit: bool = True) -> str | None:
        """Why the tensor ``name`` of ``shape`` (None: unknown) is kept plain, or None if it
        may be compressed. ``implicit=False`` applies only what the user asked (``exclude``,
        ``shapes``), not the embedding and 1-D defaults: for a plan given explicitly."""
        hit = next((p for p in self.exclude if fnmatchcase(name, p)), None)
        if hit is not None:
            return f"excluded by {hit!r}"
        if any(fnmatchcase(name, p) for p in self.include):
            return None
        if shape is not None and not self._shape_ok(name, shape):
            return f"shape {list(shape)} rejected by shapes={self._shape_label()}"
        if not implicit:
            return None
        if self.is_embedding(name, shape):
            return "embedding"
        if shape is not None and len(shape) < 2:
            return f"{len(shape)}-D"
        return None

    def _shape_ok(self, name: str, shape: tuple[int, ...]) -> bool:
        if callable(self.shapes):
            return bool(self.shapes(name, tuple(shape)))
        return self.shapes == "all" or len(shape) == 2

    def _shape_label(self) -> str:
        return repr(self.shapes) if isinstance(self.shapes, str) else "<callable>"

    def unmatched(self, names: Sequence[str]) -> list[tuple[str, str]]:
        """``(argument, pattern)`` of each ``include`` and ``exclude`` pattern that matches
        none of ``names``, in argument order."""
        return [(arg, p) for arg, patterns in (("include", self.include), ("exclude", self.exclude))
                for p in patterns if not any(fnmatchcase(n, p) for n in names)]  # fmt: skip

    def check_names(self, names: Iterable[str]) -> None:
        """Raise ValueError where an ``include`` or ``exclude`` pattern matches none of
        ``names`` (the parameters that need a gradient): a misspelt name would otherwise leave
        a tensor compressed, or plain, without a word."""
        names = list(names)
        idle = self.unmatched(names)
        if not idle:
            return
        arg, p = idle[0]
        near = get_close_matches(p, names, n=3, cutoff=0.6)
        hint = (f"did you mean {', '.join(map(repr, near))}?" if near
                else f"some: {', '.join(map(repr, names[:4]))}")  # fmt: skip
        raise ValueError(
            f"{arg}={p!r} matches no parameter that needs a gradient (patterns match "
            f"named_parameters() names, '*' matching dots too; {len(names)} names, {hint})"
        )

    def reasons(
        self, named_shapes: Iterable[tuple[str, tuple[int, ...] | None]], implicit: bool = True
    ) -> dict[str, str]:
        """``{name: why kept plain}`` for the tensors :meth:`reason` keeps plain."""
        out = {}
        for name, shape in named_shapes:
            why = self.reason(name, shape, implicit)
            if why is not None:
                out[name] = why
        return out


def embedding_names(model: Any) -> frozenset[str]:
    """The names (as ``model.named_parameters()`` gives them) of the weights of ``model``'s
    ``nn.Embedding`` and ``nn.EmbeddingBag`` modules, found by module type and matched by
    tensor identity, so a weight tied to an output layer counts under whichever name it has."""
    from torch import nn

    ids = {
        id(m.weight)
        for m in model.modules()
        if isinstance(m, nn.Embedding | nn.EmbeddingBag) and m.weight is not None
    }
    return frozenset(n for n, p in model.named_parameters() if id(p) in ids)


def named_shapes(named: Iterable[tuple[str, Any]]) -> list[tuple[str, tuple[int, ...] | None]]:
    """``(name, shape)`` of ``(name, tensor)`` pairs; a ``(name, numel)`` pair's shape is None
    (unknown)."""
    return [(n, None if isinstance(p, int) else tuple(p.shape)) for n, p in named]
