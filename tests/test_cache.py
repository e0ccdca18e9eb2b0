"""The kernel cache: keys change exactly when the generated library may change; builds are atomic,
happen once per key, and a compile error shows the generated source with line numbers. A damaged
entry is rebuilt before anything loads it; a cache directory or file that another user owns or
may write is refused; whatever the umask, the cache is private."""

from __future__ import annotations

import logging
import os
import shutil
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from hipress.compll import Algorithm, load, load_source
from hipress.compll.backends.c.native import NativeBackend, build
from hipress.compll.backends.c.program import render_c
from hipress.compll.backends.cache import (
    C_FLAGS,
    RECORD,
    CacheError,
    CompileError,
    KernelCache,
    Toolchain,
    compile_c,
    kernel_key,
)
from hipress.compll.backends.render import generator_digest
from hipress.compll.ir.source import SourceFile

TOOLCHAIN = Toolchain.detect()
needs_cc = pytest.mark.skipif(TOOLCHAIN is None, reason="no C compiler")

SRC = """
algorithm tiny "a tiny test algorithm";
param scale: f32 = 2.0;
payload { v: f32[n]; }
encode(g) { return concat(map(n, i => g[i] * scale)); }
decode(p) { return map(n, i => p.v[i] / scale); }
"""


def _prog(text: str = SRC, **params: object):
    return load_source(SourceFile("tiny.cll", text), backend="reference", **params).program


def _key(prog, tc: Toolchain | None = None, gen: str | None = None) -> str:
    tc = tc or Toolchain("/usr/bin/cc", "cc 1.0")
    return kernel_key(prog.digest(), "c", tc.identity(), gen or generator_digest("c"))


def test_comment_and_whitespace_changes_keep_the_key() -> None:
    edited = SRC.replace("encode(g)", "// a comment\n\nencode(g)  ").replace(
        "payload", "/* x */ payload"
    )
    assert _key(_prog(edited)) == _key(_prog())


def test_ir_change_changes_the_key() -> None:
    assert _key(_prog(scale=3.0)) != _key(_prog())
    assert _key(_prog(SRC.replace("g[i] * scale", "g[i] + scale"))) != _key(_prog())


def test_flag_or_compiler_change_changes_the_key() -> None:
    base = Toolchain("/usr/bin/cc", "cc 1.0")
    assert _key(_prog(), Toolchain(base.cc, base.version, (*C_FLAGS, "-DX"))) != _key(_prog(), base)
    assert _key(_prog(), Toolchain(base.cc, "cc 2.0")) != _key(_prog(), base)
    assert _key(_prog(), Toolchain("/usr/bin/clang", "cc 1.0")) != _key(_prog(), base)


def test_template_or_generator_change_changes_the_key(tmp_path: Path) -> None:
    """A copy of the package with one template byte changed hashes differently."""
    import hipress.compll as pkg

    root = Path(pkg.__file__).parent
    assert generator_digest("c", root) == generator_digest("c")
    copy = tmp_path / "compll"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("__pycache__"))
    tpl = copy / "backends" / "templates" / "c_loop.c.j2"
    tpl.write_text(tpl.read_text() + "\n")
    assert generator_digest("c", copy) != generator_digest("c")
    # a CUDA template change does not invalidate C kernels
    cu = copy / "backends" / "templates" / "cuda_loop.cu.j2"
    tpl.write_text((root / "backends" / "templates" / "c_loop.c.j2").read_text())
    cu.write_text(cu.read_text() + "\n")
    assert generator_digest("c", copy) == generator_digest("c")
    assert generator_digest("cuda", copy) != generator_digest("cuda")
    assert _key(_prog(), gen=generator_digest("c", copy)) == _key(_prog())


def test_each_target_hashes_its_own_folder_and_the_c_family_base(tmp_path: Path) -> None:
    """A change in a target's folder (renderer or runner) changes that target's digest only;
    a change in the C-family base both render with changes both."""
    import hipress.compll as pkg

    root = Path(pkg.__file__).parent
    digests = {t: generator_digest(t) for t in ("c", "cuda")}
    for rel, changed in (
        ("backends/c/render.py", {"c"}),
        ("backends/c/native.py", {"c"}),
        ("backends/cuda/render.py", {"cuda"}),
        ("backends/cuda/emu.h", {"cuda"}),
        ("backends/cfamily/family.py", {"c", "cuda"}),
        ("backends/render.py", {"c", "cuda"}),
        ("lower/lower.py", {"c", "cuda"}),
    ):
        copy = tmp_path / rel.replace("/", "_")
        shutil.copytree(root, copy, ignore=shutil.ignore_patterns("__pycache__"))
        f = copy / rel
        f.write_text(f.read_text() + "\n")
        now = {t for t in digests if generator_digest(t, copy) != digests[t]}
        assert now == changed, rel


@needs_cc
def test_ten_loads_compile_once(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path)
    prog = _prog()
    for _ in range(10):
        NativeBackend(prog, cache, TOOLCHAIN)
    assert cache.compiles == 1
    again = KernelCache(tmp_path)  # another process: finds the library on disk
    NativeBackend(prog, again, TOOLCHAIN)
    assert again.compiles == 0
    libs = list(tmp_path.rglob("*.so"))
    assert len(libs) == 1 and not list(tmp_path.rglob(".tmp-*"))
    assert (libs[0].with_suffix(".c")).read_text() == render_c(prog)


@needs_cc
def test_compile_error_shows_numbered_source(tmp_path: Path) -> None:
    assert TOOLCHAIN is not None
    source = render_c(_prog())
    lines = source.splitlines()
    at = next(k for k, ln in enumerate(lines) if "hp_decode(const hp_dec_args* a)" in ln) + 2
    lines.insert(at, "  int broken = ;")
    bad = "\n".join(lines)
    out = tmp_path / "x.so"
    with pytest.raises(CompileError) as exc:
        compile_c(bad, out, TOOLCHAIN, "tiny")
    msg = str(exc.value)
    assert "failed to compile" in msg and "error" in msg
    assert f"{at + 1} |   int broken = ;" in msg  # the line, numbered
    assert f"{at} | " in msg and f"{at + 2} | " in msg  # with context
    assert not out.exists()


@needs_cc
def test_failed_build_leaves_nothing_in_the_cache(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path)

    def fail(tmp: Path) -> None:
        raise CompileError("boom")

    with pytest.raises(CompileError):
        cache.get_or_build("ab" * 32, ".so", fail)
    assert not list(tmp_path.rglob("*.so")) and not list(tmp_path.rglob(".tmp-*"))
    assert cache.compiles == 0


def test_cache_dir_from_environment(tmp_path: Path) -> None:
    assert KernelCache.from_env({"HIPRESS_CACHE_DIR": str(tmp_path)}).root == tmp_path
    xdg = KernelCache.from_env({"XDG_CACHE_HOME": str(tmp_path)}).root
    assert xdg == tmp_path / "hipress" / "kernels"


@needs_cc
def test_build_returns_the_cached_source(tmp_path: Path) -> None:
    assert TOOLCHAIN is not None
    cache = KernelCache(tmp_path)
    p1, s1 = build(_prog(), cache, TOOLCHAIN)
    p2, s2 = build(_prog(), cache, TOOLCHAIN)
    assert p1 == p2 and s1 == s2 and cache.compiles == 1


# ---------------------------------------------------------------- damaged entries, permissions

N = 3000  # elements per test tensor
OTHER = "signsgd"  # another algorithm: another payload layout than onebit's, and no state


def _lib(cache: KernelCache, name: str) -> Path:
    """Where ``name``'s C kernel (default parameters) lives in ``cache``."""
    assert TOOLCHAIN is not None
    prog = load(name, backend="reference").program
    key = kernel_key(prog.digest(), "c", TOOLCHAIN.identity(), generator_digest("c"))
    return cache.path(key, ".so")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache with onebit's and signsgd's kernels, built but never loaded by this process (a
    process that has loaded a path gets the loaded library back from dlopen, whatever the file
    holds now)."""
    assert TOOLCHAIN is not None
    root = tmp_path_factory.mktemp("pristine") / "cache"
    for name in ("onebit", OTHER):
        build(load(name, backend="reference").program, KernelCache(root), TOOLCHAIN)
    return root


def _copy(pristine: Path, tmp_path: Path) -> KernelCache:
    shutil.copytree(pristine, tmp_path / "cache", symlinks=True)
    return KernelCache(tmp_path / "cache")


def _outputs(alg: Algorithm) -> list[torch.Tensor]:
    """Payloads and decodes of two error-feedback steps of ``alg`` on fixed inputs."""
    g = torch.Generator().manual_seed(5)
    state = alg.init_state(N, seed=9, tensor_id=3)
    out = []
    for _ in range(2):
        payload = alg.encode(torch.randn(N, generator=g), state)
        out += [payload, alg.decode(payload, N)]
    return out


def _assert_reference(outputs: list[torch.Tensor]) -> None:
    ref = _outputs(load("onebit", backend="reference"))
    for k, (a, b) in enumerate(zip(ref, outputs, strict=True)):
        assert a.dtype == b.dtype and torch.equal(a, b), f"output {k} differs from the reference"


def _garbage(lib: Path, other: Path) -> None:
    lib.write_bytes(b"\x7fELF" + bytes(range(256)) * 40)


def _empty(lib: Path, other: Path) -> None:
    lib.write_bytes(b"")


def _directory(lib: Path, other: Path) -> None:
    lib.unlink()
    lib.mkdir()
    (lib / "x").write_text("x")


def _symlink(lib: Path, other: Path) -> None:
    lib.unlink()
    lib.symlink_to(other)


def _other_library(lib: Path, other: Path) -> None:
    shutil.copyfile(other, lib)


def _other_library_and_record(lib: Path, other: Path) -> None:
    shutil.copyfile(other, lib)
    shutil.copyfile(f"{other}{RECORD}", f"{lib}{RECORD}")


def _record_removed(lib: Path, other: Path) -> None:
    shutil.copyfile(other, lib)
    os.unlink(f"{lib}{RECORD}")


DAMAGE: dict[str, Callable[[Path, Path], None]] = {
    "garbage": _garbage,
    "empty": _empty,
    "directory": _directory,
    "symlink-to-another-library": _symlink,
    "another-library": _other_library,
    "another-library-and-its-record": _other_library_and_record,
    "record-removed": _record_removed,
}


@needs_cc
@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_damaged_entry_is_rebuilt_before_it_is_loaded(
    kind: str, pristine: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert TOOLCHAIN is not None
    cache = _copy(pristine, tmp_path)
    lib = _lib(cache, "onebit")
    DAMAGE[kind](lib, _lib(cache, OTHER))
    ref = load("onebit", backend="reference")
    with caplog.at_level(logging.INFO, logger="hipress.compll.backends.cache"):
        cpu = Algorithm(ref.program, NativeBackend(ref.program, cache, TOOLCHAIN))
    assert cache.compiles == 1
    _assert_reference(_outputs(cpu))
    notes = [r for r in caplog.records if "damaged" in r.getMessage()]
    assert len(notes) == 1 and str(lib) in notes[0].getMessage()
    assert notes[0].levelno == (logging.INFO if kind == "record-removed" else logging.WARNING)
    assert stat.S_ISREG(os.lstat(lib).st_mode)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hipress.compll.backends.cache"):
        NativeBackend(ref.program, cache, TOOLCHAIN)  # now a plain hit
    assert cache.compiles == 1 and not caplog.records


TRUNCATED_LOAD = """
import sys
import torch
from hipress.compll import Algorithm, load
from hipress.compll.backends.cache import KernelCache, Toolchain
from hipress.compll.backends.c.native import NativeBackend
sys.path.insert(0, sys.argv[3])
from test_cache import _outputs
ref = load("onebit", backend="reference")
cache = KernelCache(__import__("pathlib").Path(sys.argv[1]))
cpu = Algorithm(ref.program, NativeBackend(ref.program, cache, Toolchain.detect()))
torch.save(_outputs(cpu), sys.argv[2])
print("compiles", cache.compiles)
"""


@needs_cc
def test_truncated_library_is_rebuilt_not_mapped(pristine: Path, tmp_path: Path) -> None:
    """A library cut short maps pages past its end: a load would die of SIGBUS, so the load
    runs in a child process."""
    cache = _copy(pristine, tmp_path)
    lib = _lib(cache, "onebit")
    assert lib.stat().st_size > 16000
    os.truncate(lib, 16000)
    out = tmp_path / "out.pt"
    res = subprocess.run(
        [sys.executable, "-c", TRUNCATED_LOAD, str(cache.root), str(out), str(Path(__file__).parent)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    assert "compiles 1" in res.stdout and "damaged" in res.stderr
    _assert_reference(torch.load(out))


@needs_cc
def test_builders_of_one_key_compile_it_once(tmp_path: Path) -> None:
    """Processes (here threads, each with its own cache object) starting together wait for
    the one that builds."""
    assert TOOLCHAIN is not None
    prog = _prog()
    caches = [KernelCache(tmp_path) for _ in range(4)]
    threads = [threading.Thread(target=build, args=(prog, c, TOOLCHAIN)) for c in caches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(c.compiles for c in caches) == 1


@needs_cc
def test_umask_000_still_makes_a_private_cache(tmp_path: Path) -> None:
    assert TOOLCHAIN is not None
    root = tmp_path / "a" / "b"
    old = os.umask(0)
    try:
        build(_prog(), KernelCache(root), TOOLCHAIN)
    finally:
        os.umask(old)
    entries = [tmp_path / "a", root, *root.rglob("*")]
    assert len(entries) > 6
    for p in entries:
        st = os.lstat(p)
        want = 0o700 if stat.S_ISDIR(st.st_mode) or p.suffix == ".so" else 0o600
        assert stat.S_IMODE(st.st_mode) == want, f"{p}: {stat.S_IMODE(st.st_mode):o}"


as_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file away needs root")


@needs_cc
@as_root
def test_cache_dir_of_another_user_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o700)
    os.chown(shared, 65534, 65534)
    monkeypatch.setenv("HIPRESS_CACHE_DIR", str(shared))
    with pytest.raises(CacheError) as exc:
        load("onebit", backend="cpu")
    msg = str(exc.value)
    assert msg.startswith("cache error: kernel cache directory ")
    assert str(shared) in msg and "belongs to uid 65534" in msg and "(uid 0)" in msg
    assert "set HIPRESS_CACHE_DIR to a directory of your own" in msg
    assert not list(shared.iterdir())


@needs_cc
@as_root
def test_library_of_another_user_is_refused(pristine: Path, tmp_path: Path) -> None:
    """Not even a library that matches its record is loaded if another user owns it."""
    assert TOOLCHAIN is not None
    cache = _copy(pristine, tmp_path)
    lib = _lib(cache, "onebit")
    os.chown(lib, 65534, 65534)
    prog = load("onebit", backend="reference").program
    with pytest.raises(CacheError, match=r"belongs to uid 65534") as exc:
        NativeBackend(prog, cache, TOOLCHAIN)
    assert f"kernel cache file {lib} " in str(exc.value) and f"delete {lib}" in str(exc.value)


@needs_cc
@pytest.mark.parametrize(
    ("where", "mode", "who"),
    [("root", 0o777, "group and others"), ("root", 0o770, "group"), ("shard", 0o757, "others")],
)
def test_cache_dir_others_may_write_is_refused(
    where: str, mode: int, who: str, pristine: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    cache = _copy(pristine, tmp_path)
    target = cache.root if where == "root" else _lib(cache, "onebit").parent
    os.chmod(target, mode)
    monkeypatch.setenv("HIPRESS_CACHE_DIR", str(cache.root))
    with pytest.raises(CacheError) as exc:
        load("onebit", backend="cpu")
    msg = str(exc.value)
    assert f"kernel cache directory {target} is writable by {who} (mode {mode:04o})" in msg
    assert f"run `chmod -R go-w {cache.root}`" in msg
