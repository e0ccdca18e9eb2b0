"""Parameter lists of well-known models, for planning without building them.

:func:`builtin_models` lists the built-in specs (``resnet50``, ``vgg19``, ``bert-base``,
``lstm-lm``, ``mlp``): the (name, shape) of every trainable parameter, named as torchvision /
Hugging Face name them, with no dependency on either. :func:`resolve_model` also accepts
``path/to/file.py:NAME`` and ``package.module:NAME``: an ``nn.Module`` instance, or a class or
factory returning a module, called without arguments or with the literal ones the reference
gives (``train.py:make_model(vocab=8192)``, :func:`parse_ref`). A file is imported as a module
of its own (its ``if __name__ == "__main__":`` block does not run) while ``sys.argv`` is
``[path]``, so a module-level argument parser does not see hipress's options.
:func:`module_from_spec` builds a real module with those parameters (for benchmarks).
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType, ModuleType

import torch
from torch import nn

from hipress.core.rule import embedding_names
from hipress.secopa.model.modelref import FACTORY_HELP, ModelSpecError, parse_ref

__all__ = [
    "FACTORY_HELP",
    "ModelSpec",
    "ModelSpecError",
    "builtin_models",
    "check_ref",
    "module_from_spec",
    "parse_ref",
    "resolve_model",
    "spec_of_module",
]

Shape = tuple[int, ...]


@dataclass(frozen=True)
class ModelSpec:
    """A model's trainable parameters in registration order."""

    name: str
    params: tuple[tuple[str, Shape], ...]
    # names of its nn.Embedding/EmbeddingBag weights where a module was built (None: unknown)
    embeddings: frozenset[str] | None = None

    def named_numels(self) -> list[tuple[str, int]]:
        return [(n, math.prod(s)) for n, s in self.params]

    @property
    def numel(self) -> int:
        return sum(math.prod(s) for _, s in self.params)


def _bn(prefix: str, c: int) -> Iterator[tuple[str, Shape]]:
    yield f"{prefix}.weight", (c,)
    yield f"{prefix}.bias", (c,)


def _linear(prefix: str, out: int, inp: int) -> Iterator[tuple[str, Shape]]:
    yield f"{prefix}.weight", (out, inp)
    yield f"{prefix}.bias", (out,)


def resnet50() -> Iterator[tuple[str, Shape]]:
    """torchvision ``resnet50()`` (25.6M parameters)."""
    yield "conv1.weight", (64, 3, 7, 7)
    yield from _bn("bn1", 64)
    inplanes = 64
    for li, (planes, blocks) in enumerate(((64, 3), (128, 4), (256, 6), (512, 3)), start=1):
        for b in range(blocks):
            p = f"layer{li}.{b}"
            yield f"{p}.conv1.weight", (planes, inplanes, 1, 1)
            yield from _bn(f"{p}.bn1", planes)
            yield f"{p}.conv2.weight", (planes, planes, 3, 3)
            yield from _bn(f"{p}.bn2", planes)
            yield f"{p}.conv3.weight", (planes * 4, planes, 1, 1)
            yield from _bn(f"{p}.bn3", planes * 4)
            if b == 0:
                yield f"{p}.downsample.0.weight", (planes * 4, inplanes, 1, 1)
                yield from _bn(f"{p}.downsample.1", planes * 4)
            inplanes = planes * 4
    yield from _linear("fc", 1000, 2048)


def vgg19() -> Iterator[tuple[str, Shape]]:
    """torchvision ``vgg19()`` without batch norm (143.7M parameters)."""
    cfg = [64, 64, 0, 128, 128, 0, 256, 256, 256, 256, 0]
    cfg += [512, 512, 512, 512, 0, 512, 512, 512, 512, 0]
    idx, cin = 0, 3
    for c in cfg:
        if c == 0:  # max-pool: one index
            idx += 1
            continue
        yield f"features.{idx}.weight", (c, cin, 3, 3)
        yield f"features.{idx}.bias", (c,)
        idx, cin = idx + 2, c  # conv + relu
    yield from _linear("classifier.0", 4096, 512 * 7 * 7)
    yield from _linear("classifier.3", 4096, 4096)
    yield from _linear("classifier.6", 1000, 4096)


def bert_base() -> Iterator[tuple[str, Shape]]:
    """Hugging Face ``BertModel`` base, uncased vocabulary (109.5M parameters)."""
    h, ff = 768, 3072
    yield "embeddings.word_embeddings.weight", (30522, h)
    yield "embeddings.position_embeddings.weight", (512, h)
    yield "embeddings.token_type_embeddings.weight", (2, h)
    yield from _bn("embeddings.LayerNorm", h)
    for i in range(12):
        p = f"encoder.layer.{i}"
        for q in ("query", "key", "value"):
            yield from _linear(f"{p}.attention.self.{q}", h, h)
        yield from _linear(f"{p}.attention.output.dense", h, h)
        yield from _bn(f"{p}.attention.output.LayerNorm", h)
        yield from _linear(f"{p}.intermediate.dense", ff, h)
        yield from _linear(f"{p}.output.dense", h, ff)
        yield from _bn(f"{p}.output.LayerNorm", h)
    yield from _linear("pooler.dense", h, h)


def lstm_lm() -> Iterator[tuple[str, Shape]]:
    """A 2-layer LSTM language model with a large tied-size vocabulary (50k x 1024)."""
    vocab, h = 50000, 1024
    yield "encoder.weight", (vocab, h)
    for layer in range(2):
        yield f"rnn.weight_ih_l{layer}", (4 * h, h)
        yield f"rnn.weight_hh_l{layer}", (4 * h, h)
        yield f"rnn.bias_ih_l{layer}", (4 * h,)
        yield f"rnn.bias_hh_l{layer}", (4 * h,)
    yield from _linear("decoder", vocab, h)


def mlp() -> Iterator[tuple[str, Shape]]:
    """A small MLP (4.5M parameters) with tensors from 10 to 2M elements, for benchmarks."""
    yield from _linear("fc1", 2048, 1024)
    yield from _linear("fc2", 1024, 2048)
    yield from _linear("fc3", 256, 1024)
    yield from _linear("fc4", 10, 256)


_BUILTIN: Mapping[str, Callable[[], Iterator[tuple[str, Shape]]]] = MappingProxyType(
    {
        "resnet50": resnet50,
        "vgg19": vgg19,
        "bert-base": bert_base,
        "lstm-lm": lstm_lm,
        "mlp": mlp,
    }
)


def builtin_models() -> list[str]:
    """Names accepted by :func:`resolve_model` besides ``module:attr``."""
    return sorted(_BUILTIN)


def spec_of_module(name: str, module: nn.Module) -> ModelSpec:
    """The trainable parameters of ``module`` (``named_parameters`` order)."""
    params = tuple((n, tuple(p.shape)) for n, p in module.named_parameters() if p.requires_grad)
    return ModelSpec(name, params, embedding_names(module))


def check_ref(ref: str) -> None:
    """What can be checked of a model reference without importing anything: a built-in name,
    or a reference :func:`parse_ref` reads whose file (when it names one) exists. Raises
    :class:`ModelSpecError`."""
    if ref in _BUILTIN:
        return
    if ":" not in ref:
        raise ModelSpecError(f"unknown model {ref!r}: use one of {builtin_models()}, "
                             f"path/to/file.py:NAME or package.module:NAME")  # fmt: skip
    parsed = parse_ref(ref)
    if parsed.is_file and not Path(parsed.where).expanduser().is_file():
        raise ModelSpecError(f"{ref!r}: no such file {parsed.where!r}")


def _load_file(ref: str, where: str) -> ModuleType:
    """Execute the Python file ``where`` as a fresh module; its folder is on ``sys.path``
    while it runs, so it can import its neighbours as ``python train.py`` would."""
    path = Path(where).expanduser()
    if not path.is_file():
        raise ModelSpecError(f"{ref!r}: no such file {str(path)!r}")
    spec = importlib.util.spec_from_file_location(f"_hipress_model_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ModelSpecError(f"{ref!r}: {str(path)!r} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    folder = str(path.resolve().parent)
    sys.path.insert(0, folder)
    argv, sys.argv = sys.argv, [str(path)]  # as `python train.py` would see it, no options
    sys.modules[spec.name] = module  # (as an import does: dataclasses and pickle look it up)
    try:
        spec.loader.exec_module(module)
    except SystemExit as exc:  # a module-level parse_args() or exit(): report, do not exit
        del sys.modules[spec.name]
        raise ModelSpecError(_exited(ref, str(path), exc)) from None
    except Exception as exc:  # the user's file: report, never a raw traceback
        del sys.modules[spec.name]
        raise ModelSpecError(f"{ref!r}: running {str(path)!r} failed: {_describe(exc)}") from None
    finally:
        sys.argv = argv
        sys.path.remove(folder)
    return module


def _exited(ref: str, where: str, exc: SystemExit) -> str:
    return (
        f"{ref!r}: importing {where!r} exited (status {exc.code}); it ran with no command-line "
        'arguments: move argument parsing and training under `if __name__ == "__main__":`, '
        "or put the model in a file of its own"
    )


def _import_module(ref: str, where: str) -> ModuleType:
    """Import ``where`` with the current directory on ``sys.path`` (as ``python -m`` has it;
    the console script does not)."""
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    argv, sys.argv = sys.argv, [where]
    try:
        return importlib.import_module(where)
    except SystemExit as exc:
        raise ModelSpecError(_exited(ref, where, exc)) from None
    except Exception as exc:
        raise ModelSpecError(
            f"{ref!r}: cannot import {where!r}: {_describe(exc)} (give a file as "
            "path/to/file.py:NAME, or a module importable from the current directory)"
        ) from None
    finally:
        sys.argv = argv
        if added and cwd in sys.path:
            sys.path.remove(cwd)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _import(ref: str) -> nn.Module:
    r = parse_ref(ref)
    where, attr = r.where, r.attr
    obj: object = _load_file(ref, where) if r.is_file else _import_module(ref, where)
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ModelSpecError(f"{ref!r}: {where!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if isinstance(obj, nn.Module) and not r.called:
        return obj
    if not callable(obj) or isinstance(obj, nn.Module):
        what = "an nn.Module instance" if isinstance(obj, nn.Module) else type(obj).__name__
        raise ModelSpecError(
            f"{ref!r}: {attr} is {what}, not a class or factory to call; {FACTORY_HELP}"
            if r.called else
            f"{ref!r} is a {what}, not an nn.Module or factory; {FACTORY_HELP}"
        )  # fmt: skip
    shown = ", ".join([*map(repr, r.args), *(f"{k}={v!r}" for k, v in r.kwargs.items())])
    try:
        made = obj(*r.args, **r.kwargs)
    except TypeError as exc:
        how = f"with ({shown})" if r.called else "without arguments"
        raise ModelSpecError(f"{ref!r}: calling it {how} failed ({exc}); {FACTORY_HELP}") from None
    except Exception as exc:
        raise ModelSpecError(f"{ref!r}: {attr}({shown}) raised {_describe(exc)}") from None
    if isinstance(made, nn.Module):
        return made
    raise ModelSpecError(f"{ref!r}: {attr}() returned {type(made).__name__}; {FACTORY_HELP}")


def resolve_model(ref: str) -> ModelSpec:
    """A built-in model name, ``path/to/file.py:NAME`` or ``package.module:NAME`` (each
    optionally with literal call arguments, ``NAME(vocab=8192)``: :func:`parse_ref`) -> its
    :class:`ModelSpec`. NAME is an ``nn.Module`` instance, or a class or factory returning one,
    called with the arguments given (none if none are; see :data:`FACTORY_HELP`).

    Raises :class:`ModelSpecError` saying what to give instead on anything else.
    """
    if ref in _BUILTIN:
        return ModelSpec(ref, tuple(_BUILTIN[ref]()))
    if ":" in ref:
        return spec_of_module(ref, _import(ref))
    raise ModelSpecError(
        f"unknown model {ref!r}: use one of {builtin_models()}, path/to/file.py:NAME or "
        f"package.module:NAME ({FACTORY_HELP})"
    )


class SpecModule(nn.Module):
    """A module holding exactly a spec's parameters (same names), for benchmarks.

    ``forward(x)`` returns a scalar that depends on every parameter, ``sum_i c_i * sum(p_i)``
    times ``x.sum()``, so one backward produces a gradient for all of them.
    """

    def __init__(self, params: Sequence[tuple[str, Shape]], seed: int = 0) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self._order: list[str] = []
        for name, shape in params:
            owner: nn.Module = self
            *path, leaf = name.split(".")
            for part in path:
                if not hasattr(owner, part):
                    owner.add_module(part, nn.Module())
                owner = getattr(owner, part)
            owner.register_parameter(leaf, nn.Parameter(torch.randn(shape, generator=gen)))
            self._order.append(name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        total = x.new_zeros(())
        for i, (_, p) in enumerate(self.named_parameters()):
            total = total + (i % 7 + 1) * 1e-3 * p.sum()
        return total * x.sum()


def module_from_spec(spec: ModelSpec, seed: int = 0) -> nn.Module:
    """A :class:`SpecModule` with ``spec``'s parameters (names and shapes)."""
    return SpecModule(spec.params, seed)
