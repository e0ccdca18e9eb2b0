"""hipress: compression-aware data-parallel training for PyTorch.

Three parts:

- :mod:`hipress.compll` -- a small DSL for gradient-compression algorithms, its checker, IR,
  reference interpreter and generated kernels.
- :mod:`hipress.secopa` -- a measured cost model that plans, per tensor, whether and how to
  compress.
- :mod:`hipress.casync` -- compression-aware synchronisation on ``torch.distributed`` (a DDP
  communication hook).
"""

from __future__ import annotations

__version__ = "0.1.0"
