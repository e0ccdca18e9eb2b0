"""CompLL: a small language for gradient-compression algorithms.

Pipeline: ``.cll`` text -> :mod:`~hipress.compll.frontend` (parse, check: the IR of
:mod:`~hipress.compll.ir`) -> :mod:`~hipress.compll.lower` (a kernel plan) ->
:mod:`~hipress.compll.backends` (generated C and CUDA kernels; the reference interpreter).

    >>> from hipress.compll import load
    >>> alg = load("terngrad", bitwidth=2)
    >>> st = alg.init_state(grad.numel())
    >>> payload = alg.encode(grad, st)
    >>> approx = alg.decode(payload, grad.numel())
"""

from __future__ import annotations

from hipress.compll.algorithm import (
    Algorithm,
    algorithms,
    build_all_kernels,
    load,
    load_file,
    load_source,
    shipped_path,
)
from hipress.compll.backends.base import BackendError
from hipress.compll.ir.source import (
    CllError,
    CllParamError,
    CllSyntaxError,
    CllTypeError,
    SourceFile,
)
from hipress.compll.ir.state import State

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
    "build_all_kernels",
    "load",
    "load_file",
    "load_source",
    "shipped_path",
]
