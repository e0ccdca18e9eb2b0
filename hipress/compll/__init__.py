"""CompLL: a small language for gradient-compression algorithms.

Pipeline: ``.cll`` text -> :mod:`parse` (AST) -> :mod:`check` (IR) -> backends
(:mod:`interp` reference interpreter; generated C and CUDA kernels).

    >>> from hipress.compll import load
    >>> alg = load("terngrad", bitwidth=2)
    >>> st = alg.init_state(grad.numel())
    >>> payload = alg.encode(grad, st)
    >>> approx = alg.decode(payload, grad.numel())
"""

from __future__ import annotations

from hipress.compll.algorithm import (
    Algorithm,
    BackendError,
    algorithms,
    load,
    load_file,
    load_source,
    shipped_path,
)
from hipress.compll.source import CllError, CllParamError, CllSyntaxError, CllTypeError, SourceFile
from hipress.compll.state import State

__all__ = [
    "Algorithm",
    "BackendError",
    "CllError",
    "CllParamError",
    "CllSyntaxError",
    "CllTypeError",
    "SourceFile",
    "State",
    "algorithms",
    "load",
    "load_file",
    "load_source",
    "shipped_path",
]
