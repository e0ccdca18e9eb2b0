"""Stage: kernel source -> compiled library, through a content-addressed on-disk cache.

The key of a compiled kernel covers everything that decides its bytes: the IR digest, the target,
the compiler's identity and flags, the machine (``-march=native``) and a digest of the generator's
own sources and templates. Entries are written atomically (temporary file + rename), so
concurrent processes never see a partial library; builds of one key are serialised by a lock
file, so processes starting together compile it once.

Every entry has a digest record next to it (``<entry>.sha256``: sha256, size and name), written
at build time. A file is used only after its bytes are read and match its record, so a damaged
entry (garbage, empty, truncated, a directory or a symbolic link in its place, another entry's
file copied under this key) is never loaded: it is rebuilt, with one warning. The record is what
is trusted, so it only guards against accidents: whoever can write the cache directory can write
a matching record too (a library also carries its key, checked once loaded: ``libload``). That is why directories are created 0700 and files 0600 (0700 for
libraries) whatever the umask, and why a cache directory or file that belongs to another user, or
that group or others may write, is refused with a :class:`CacheError` (as ssh and pip refuse
them). The directories above the cache directory are not checked. Between the check and the
``dlopen`` of the same path, only this user (or root) could change the file.

The cache lives under the user's cache directory (``$XDG_CACHE_HOME/hipress/kernels`` or
``~/.cache/hipress/kernels``); ``HIPRESS_CACHE_DIR`` overrides it.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import platform
import re
import shlex
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from hipress.compll.backends.files import makedirs_private, remove_dir, write_private
from hipress.compll.backends.text import explain
from hipress.compll.ir.source import CllError

log = logging.getLogger(__name__)

RECORD = ".sha256"  # suffix of an entry's digest record
_RECORD_RE = re.compile(r"sha256=([0-9a-f]{64}) size=(\d+) name=(\S+)\n")

C_FLAGS = (
    "-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-fno-math-errno", "-fPIC",
    "-shared", "-std=gnu11",
) + (
    # where the CPU has AVX-512, gcc otherwise vectorises with 256-bit registers, which cost
    # several encodes (bf16, tbq, qsgd, dgc, graddrop) 10-30% of their throughput and made none
    # faster; without AVX-512 it changes nothing (an x86 option)
    ("-mprefer-vector-width=512",) if platform.machine().lower() in ("x86_64", "amd64") else ()
)  # fmt: skip


class CompileError(CllError):
    """Generated code did not compile; the message shows the source with line numbers."""

    kind = "compile error"


class CacheError(CllError):
    """The kernel cache cannot be used safely (a directory or file of another user, or one that
    group or others may write) or at all (it cannot be created); the message names the path,
    what was found and what to do."""

    kind = "cache error"


class _Damaged(Exception):
    """A cache entry to build again: ``reason`` says what is wrong with it, None if it is only
    absent."""

    def __init__(self, reason: str | None) -> None:
        super().__init__(reason)
        self.reason = reason


# the C compilers looked for on PATH when $CC is not set, in order
C_COMPILERS = ("cc", "gcc", "clang")


@dataclass(frozen=True)
class Toolchain:
    """A C compiler: its path, its ``--version`` banner and the flags kernels are built with."""

    cc: str
    version: str
    flags: tuple[str, ...] = C_FLAGS

    @classmethod
    def detect(cls, environ: Mapping[str, str] | None = None) -> Toolchain | None:
        """The compiler named by ``$CC``, else ``cc``/``gcc``/``clang`` on PATH; None if none
        runs."""
        found = find_compiler(environ, "CC", C_COMPILERS)
        return cls(*found) if found else None

    def identity(self) -> str:
        """What the cache key needs to know about the compiler and the machine it targets."""
        return "\n".join([self.cc, self.version, " ".join(self.flags), _machine()])


def find_compiler(
    environ: Mapping[str, str] | None, var: str, names: tuple[str, ...]
) -> tuple[str, str] | None:
    """(path, first line of ``--version``) of the compiler named by ``$var``, else of the first
    of ``names`` on PATH that runs; None if none does."""
    env = os.environ if environ is None else environ
    for name in [env[var]] if env.get(var) else names:
        path = shutil.which(name)
        if path is None:
            continue
        try:
            res = subprocess.run(
                [path, "--version"], capture_output=True, text=True, timeout=30, check=False
            )
        except (OSError, subprocess.SubprocessError):
            continue
        if res.returncode == 0:
            return path, (res.stdout.strip().splitlines() or ["?"])[0]
    return None


def missing_compiler(environ: Mapping[str, str] | None, var: str, names: tuple[str, ...]) -> str:
    """Why :func:`find_compiler` found nothing, and what to do, in words."""
    env = os.environ if environ is None else environ
    if env.get(var):
        value = env[var]
        if shutil.which(value) is None:
            return f"${var}={value} names no executable (no such file, or not on PATH)"
        return f"${var}={value} does not run (`{value} --version` failed)"
    return f"no compiler on PATH (tried {', '.join(names)}); install one (e.g. gcc) or set ${var}"


def _machine() -> str:
    """The CPU the libraries are built for (``-march=native``)."""
    parts = [platform.machine(), platform.system()]
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return " ".join(parts)
    for key in ("model name", "flags"):
        m = re.search(rf"^{key}\s*:\s*(.*)$", text, re.MULTILINE)
        if m:
            parts.append(hashlib.sha256(m.group(1).encode()).hexdigest()[:16])
    return " ".join(parts)


def kernel_key(ir_digest: str, target: str, toolchain: str, generator: str) -> str:
    """The content address of a compiled kernel (hex sha256)."""
    h = hashlib.sha256()
    for part in (ir_digest, target, toolchain, generator):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


@dataclass
class KernelCache:
    """A directory of compiled kernels keyed by :func:`kernel_key` (see the module doc for what
    is checked before a file is used).

    ``compiles`` counts the builds this object has run (the rest were cache hits).
    """

    root: Path
    compiles: int = field(default=0, compare=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> KernelCache:
        env = os.environ if environ is None else environ
        if env.get("HIPRESS_CACHE_DIR"):
            return cls(Path(env["HIPRESS_CACHE_DIR"]))
        base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        return cls(Path(base) / "hipress" / "kernels")

    def path(self, key: str, suffix: str) -> Path:
        return self.root / key[:2] / f"{key}{suffix}"

    def get_or_build(self, key: str, suffix: str, build: Callable[[Path], None]) -> Path:
        """The cached file for ``key``, its bytes just checked against its digest record;
        built with ``build(tmp_path)`` if absent, and built again (with a warning) if damaged.

        Raises :class:`CacheError` if the cache directory or the file is not safe to use.
        """
        return self._entry(key, suffix, build, count=True)[0]

    def rebuild(self, key: str, suffix: str, build: Callable[[Path], None]) -> Path:
        """Build the entry of ``key`` again, whatever is there (see
        :mod:`hipress.compll.backends.libload`: a library that is not its key's kernel)."""
        dst = self.path(key, suffix)
        self._prepare(dst.parent)
        with self._locked(dst):
            self._build(dst, build, True)
        return dst

    def data(self, key: str, suffix: str, make: Callable[[], bytes], count: bool = True) -> bytes:
        """The bytes stored under ``key`` (checked like :meth:`get_or_build`), else ``make()``,
        stored atomically; a build is counted in ``compiles`` if ``count``."""
        made: list[bytes] = []

        def write(tmp: Path) -> None:
            made.append(make())
            tmp.write_bytes(made[-1])

        data = self._entry(key, suffix, write, count)[1]
        return made[-1] if data is None else data

    def text(self, key: str, suffix: str, make: Callable[[], str]) -> str:
        """:meth:`data` for UTF-8 text, not counted in ``compiles``."""
        return self.data(key, suffix, lambda: make().encode(), count=False).decode(errors="replace")

    def _entry(
        self, key: str, suffix: str, build: Callable[[Path], None], count: bool
    ) -> tuple[Path, bytes | None]:
        """(path, the bytes checked) of a valid entry; (path, None) where it was built now."""
        dst = self.path(key, suffix)
        self._prepare(dst.parent)
        try:
            return dst, self._verified(dst)
        except _Damaged:
            pass
        with self._locked(dst):
            try:  # another process may have built it while this one waited for the lock
                return dst, self._verified(dst)
            except _Damaged as exc:
                reason = exc.reason
            self._build(dst, build, count)
        if reason is not None:
            # an entry from before digests were recorded is not worth a warning
            level = logging.INFO if reason == _NO_RECORD else logging.WARNING
            log.log(level, "kernel cache: replaced %s, which was damaged (%s)", dst, reason)
        return dst, None

    def _prepare(self, shard: Path) -> None:
        """Create the cache directory and ``shard`` (0700) if absent, after refusing the cache
        directory if it is not this user's own; then refuse ``shard`` likewise."""
        for d in (self.root, shard):
            try:
                makedirs_private(d)
                st = (os.stat if d == self.root else os.lstat)(d)
            except OSError as exc:
                raise CacheError(
                    f"cannot create the kernel cache directory {d}: {exc.strerror}; set "
                    "HIPRESS_CACHE_DIR to a directory of your own"
                ) from None
            if not stat.S_ISDIR(st.st_mode):
                raise CacheError(
                    f"the kernel cache directory {d} is not a directory; delete it or set "
                    "HIPRESS_CACHE_DIR to a directory of your own"
                )
            self._check_owner(d, st, "directory")

    def _check_owner(self, path: Path, st: os.stat_result, what: str) -> None:
        """Refuse ``path`` unless it belongs to this user and (a symbolic link's mode aside)
        neither group nor others may write it."""
        uid = os.geteuid()
        mode = stat.S_IMODE(st.st_mode)
        if st.st_uid == uid and (stat.S_ISLNK(st.st_mode) or not mode & 0o022):
            return
        root = shlex.quote(str(self.root))
        if st.st_uid != uid:
            found = f"belongs to uid {st.st_uid}, not to this user (uid {uid})"
            fix = "set HIPRESS_CACHE_DIR to a directory of your own"
            if what == "file":
                fix = f"delete {shlex.quote(str(path))} (it is built again) or {fix}"
        else:
            who = " and ".join(w for w, bit in (("group", 0o020), ("others", 0o002)) if mode & bit)
            found = f"is writable by {who} (mode {mode:04o})"
            fix = (
                f"run `chmod -R go-w {root}` (or delete {root}: it only holds compiled "
                "kernels), or set HIPRESS_CACHE_DIR to a directory of your own"
            )
        raise CacheError(
            f"kernel cache {what} {path} {found}, so another user could plant code that this "
            f"process would run; {fix}"
        )

    def _read(self, path: Path, limit: int | None = None) -> bytes:
        """The bytes of the regular file ``path`` (at most ``limit``); :class:`_Damaged` if it
        is absent, not a regular file or unreadable."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            raise _Damaged(None) from None
        except OSError as exc:
            raise _Damaged(f"cannot stat it: {exc.strerror}") from None
        self._check_owner(path, st, "file")
        if stat.S_ISLNK(st.st_mode):
            raise _Damaged("a symbolic link in place of the file")
        if not stat.S_ISREG(st.st_mode):
            raise _Damaged("not a regular file")
        if limit is not None and st.st_size > limit:
            raise _Damaged(f"{st.st_size} bytes, larger than expected")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as f:
                fst = os.fstat(f.fileno())
                data = f.read()
        except OSError as exc:
            raise _Damaged(f"cannot read it: {exc.strerror}") from None
        if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):
            raise _Damaged("replaced while it was checked")
        return data

    def _verified(self, dst: Path) -> bytes:
        """The bytes of ``dst`` if they match its digest record, else :class:`_Damaged`."""
        try:
            record = self._read(_record(dst), limit=256)
            m = _RECORD_RE.fullmatch(record.decode("ascii", errors="replace"))
            if m is None:
                raise _Damaged("not in the expected format")
        except _Damaged as exc:
            try:
                self._check_owner(dst, os.lstat(dst), "file")
            except FileNotFoundError:
                raise _Damaged(None) from None  # a plain miss
            raise _Damaged(
                f"its digest record: {exc.reason}" if exc.reason else _NO_RECORD
            ) from None
        size = int(m.group(2))
        data = self._read(dst, limit=size)
        if len(data) != size:
            raise _Damaged(f"{len(data)} bytes where its record says {size}")
        if m.group(3) != dst.name or hashlib.sha256(data).hexdigest() != m.group(1):
            raise _Damaged("its bytes do not match its digest record")
        return data

    @contextmanager
    def _locked(self, dst: Path) -> Iterator[None]:
        """Hold the lock file of ``dst`` (one builder per key, across processes)."""
        lock = dst.with_name(dst.name + ".lock")
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise CacheError(
                f"cannot open the kernel cache lock {lock}: {exc.strerror}; delete it"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _build(self, dst: Path, build: Callable[[Path], None], count: bool) -> None:
        """Build ``dst`` (caller holds its lock): into a temporary file, made private,
        recorded, then renamed over whatever was there."""
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=dst.suffix, dir=dst.parent)
        os.close(fd)
        try:
            build(Path(tmp))
            if count:
                self.compiles += 1
            try:
                # a linker creates its output with the umask's mode: libraries become 0700
                os.chmod(tmp, 0o700 if os.stat(tmp).st_mode & 0o111 else 0o600)
                data = Path(tmp).read_bytes()
                digest = hashlib.sha256(data).hexdigest()
                remove_dir(dst)
                os.replace(tmp, dst)
                write_private(
                    _record(dst), f"sha256={digest} size={len(data)} name={dst.name}\n", RECORD
                )
            except OSError as exc:
                raise CacheError(f"cannot write the kernel cache entry {dst}: {exc}") from None
        finally:
            if os.path.lexists(tmp):
                os.unlink(tmp)


_NO_RECORD = "no digest recorded"


def _record(dst: Path) -> Path:
    return dst.with_name(dst.name + RECORD)


def compile_c(source: str, out: Path, toolchain: Toolchain, name: str = "kernel") -> None:
    """Compile C ``source`` into the shared library ``out``.

    Raises :class:`CompileError` with the compiler's messages and the source, with line
    numbers, around each error.
    """
    with tempfile.TemporaryDirectory(prefix="hipress-cc-") as d:
        safe = re.sub(r"[^A-Za-z0-9_]", "_", name)[:64] or "kernel"
        src = Path(d) / f"{safe}.c"
        src.write_text(source)
        cmd = [toolchain.cc, *toolchain.flags, "-o", str(out), str(src)]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise CompileError(explain(res.stderr, source, src.name))
