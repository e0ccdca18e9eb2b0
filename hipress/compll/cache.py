"""Stage: kernel source -> compiled library, through a content-addressed on-disk cache.

The key of a compiled kernel covers everything that decides its bytes: the IR digest, the target,
the compiler's identity and flags, the machine (``-march=native``) and a digest of the generator's
own sources and templates. Entries are written atomically (temporary file + rename), so
concurrent processes never see a partial library; a second build of the same key is harmless.

The cache lives under the user's cache directory (``$XDG_CACHE_HOME/hipress/kernels`` or
``~/.cache/hipress/kernels``); ``HIPRESS_CACHE_DIR`` overrides it.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hipress.compll.source import CllError

C_FLAGS = (
    "-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-fno-math-errno", "-fPIC",
    "-shared", "-std=gnu11",
) + (
    # where the CPU has AVX-512, gcc otherwise vectorises with 256-bit registers (measured on
    # an AVX-512 Xeon, 32M floats, both widths alternating: encode bf16 8.7-9.3 -> 12.4-12.9
    # GB/s, tbq 6.3-6.5 -> 8.2-8.4, qsgd 3.6 -> 4.4-4.5, dgc and graddrop 6.2-6.3 -> 7.1-7.6,
    # none slower beyond the noise); without AVX-512 it changes nothing (an x86 option)
    ("-mprefer-vector-width=512",) if platform.machine().lower() in ("x86_64", "amd64") else ()
)  # fmt: skip


class CompileError(CllError):
    """Generated code did not compile; the message shows the source with line numbers."""

    kind = "compile error"


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
        found = find_compiler(environ, "CC", ("cc", "gcc", "clang"))
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
    """A directory of compiled kernels keyed by :func:`kernel_key`.

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
        """The cached file for ``key``, building it with ``build(tmp_path)`` if absent."""
        dst = self.path(key, suffix)
        if dst.exists():
            return dst
        dst.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=suffix, dir=dst.parent)
        os.close(fd)
        try:
            build(Path(tmp))
            self.compiles += 1
            os.replace(tmp, dst)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return dst

    def put_text(self, key: str, suffix: str, text: str) -> Path:
        """Store ``text`` under ``key`` atomically (e.g. the source next to its library)."""
        dst = self.path(key, suffix)
        if dst.exists():
            return dst

        def write(tmp: Path) -> None:
            tmp.write_text(text)

        compiles = self.compiles
        out = self.get_or_build(key, suffix, write)
        self.compiles = compiles
        return out


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


def explain(log: str, source: str, fname: str) -> str:
    """A compiler ``log`` for generated ``source`` with the source shown, numbered, around each
    error line (gcc/clang ``file:LINE:COL: error``, NVRTC ``file(LINE): error``)."""
    from hipress.compll.render import numbered

    pat = rf"{re.escape(fname)}(?::(\d+):(?:\d+:)?|\((\d+)\):) (?:fatal )?error"
    lines = sorted({int(m.group(1) or m.group(2)) for m in re.finditer(pat, log)})
    parts = [f"generated code failed to compile:\n{log.strip()}"]
    for ln in lines[:3]:
        parts.append(f"\ngenerated source around line {ln}:\n{numbered(source, ln)}")
    if not lines:
        parts.append(f"\ngenerated source:\n{numbered(source)}")
    return "\n".join(parts)
