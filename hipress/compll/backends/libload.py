"""Stage: a cached library -> a loaded one that is the kernel of its key.

A cache entry's digest record (:mod:`hipress.compll.backends.cache`) proves that its bytes are
the bytes written under its key, not that they are the kernel of that key: a library copied
over another entry together with a matching record passes it, and calling it with the other
program's arguments crashes the process. So every library carries its key: the source it is
compiled from ends with a definition of :data:`KEY_SYMBOL` holding the key, and a library is
used only after it is loaded (``dlopen`` runs no code of ours before that, but the compiler's
own initialisers) and that symbol is read back and compared. A library whose key differs or is
missing is unloaded and built again, once, with a warning; if the library built then still
does not carry the key, :class:`KernelKeyError` is raised.
"""

from __future__ import annotations

import _ctypes
import ctypes
import logging
from collections.abc import Callable
from pathlib import Path

from hipress.compll.backends.cache import CacheError, KernelCache

log = logging.getLogger(__name__)

KEY_SYMBOL = "hp_kernel_key"
_KEY_LEN = 64  # a sha256 in hex


class KernelKeyError(CacheError):
    """A cached library is not the kernel of its key, even when built again."""


def key_definition(key: str, cxx: bool = False) -> str:
    """Source text that defines :data:`KEY_SYMBOL` as ``key``, appended to a library's source
    (``cxx``: C++, where the definition needs C linkage to keep its name)."""
    link = 'extern "C" ' if cxx else ""
    return (
        "\n/* the cache key this library was built for: read back after loading, before use */\n"
        f'{link}const char {KEY_SYMBOL}[{_KEY_LEN + 1}] = "{key}";\n'
    )


def key_of(lib: ctypes.CDLL) -> str | None:
    """The key a loaded library carries, or None where it has none."""
    try:
        raw = (ctypes.c_char * (_KEY_LEN + 1)).in_dll(lib, KEY_SYMBOL)
    except ValueError:
        return None
    return raw.value.decode("ascii", errors="replace")


def load_checked(
    cache: KernelCache, key: str, suffix: str, build: Callable[[Path], None],
    opener: Callable[[Path], ctypes.CDLL],
) -> tuple[Path, ctypes.CDLL]:  # fmt: skip
    """The library of ``key`` (``build`` writes it, with :func:`key_definition` in its source)
    loaded with ``opener``, after checking that it carries ``key``; a library that does not is
    unloaded and built again, once. Raises :class:`KernelKeyError` if that does not help."""
    path = cache.get_or_build(key, suffix, build)
    lib = opener(path)
    found = key_of(lib)
    if found == key:
        return path, lib
    log.warning(
        "kernel cache: %s is not the kernel of its key (it carries %s); building it again",
        path, found[:16] if found else "no key",
    )  # fmt: skip
    _ctypes.dlclose(lib._handle)  # unused so far: nothing of it was called
    cache.rebuild(key, suffix, build)
    lib = opener(path)
    found = key_of(lib)
    if found != key:
        raise KernelKeyError(
            f"kernel library {path} is not the kernel of its key {key[:16]} (it carries "
            f"{found[:16] if found else 'no key'}) even after building it again; delete "
            f"{cache.root} or set HIPRESS_CACHE_DIR to a new directory"
        )
    return path, lib
