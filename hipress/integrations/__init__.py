"""hipress in the training frameworks people already use: PyTorch Lightning, Hugging Face
Accelerate and the Hugging Face ``Trainer`` (Horovod has its own package, :mod:`hipress.horovod`).

Each integration is a module of its own that imports its framework when it is imported, so
``import hipress`` never needs Lightning, Accelerate or transformers:

    from hipress.integrations.lightning import HipressCallback   # pip install 'hipress[lightning]'
    from hipress.integrations import accelerate                  # pip install 'hipress[accelerate]'
    from hipress.integrations import huggingface                 # pip install 'hipress[huggingface]'

Each registers :func:`~hipress.casync.casync_hook` on the framework's own
``DistributedDataParallel`` object and hands :meth:`~hipress.casync.CaSyncState.metrics` to the
framework's logging. Lightning and Accelerate also keep every rank's compression state in the
framework's checkpoint (written by rank 0 only). See docs/how-to/frameworks.md.
"""

from __future__ import annotations
