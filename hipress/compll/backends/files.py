"""Private files and directories of the kernel cache (:mod:`hipress.compll.backends.cache`):
atomic writes, mode 0600 files and 0700 directories whatever the umask."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path


def remove_dir(path: Path) -> None:
    """Remove a directory that stands where a file goes (rename cannot replace one)."""
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path)
    except FileNotFoundError:
        pass


def write_private(dst: Path, text: str, suffix: str = "") -> None:
    """Write ``text`` to ``dst`` atomically, mode 0600 (the temporary file next to it ends
    with ``suffix``)."""
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=suffix, dir=dst.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        remove_dir(dst)
        os.replace(tmp, dst)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def makedirs_private(path: Path) -> None:
    """Create ``path`` and any missing parents, each 0700 whatever the umask (mkdir's mode is
    masked by it)."""
    if path.is_dir():
        return
    if path.parent != path:
        makedirs_private(path.parent)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        return
    os.chmod(path, 0o700)


__all__ = ["makedirs_private", "remove_dir", "write_private"]
