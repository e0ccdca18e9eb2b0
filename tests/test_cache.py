"""The kernel cache: keys change exactly when the generated library may change; builds are atomic,
happen once per key, and a compile error shows the generated source with line numbers."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hipress.compll import load_source
from hipress.compll.cache import (
    C_FLAGS,
    CompileError,
    KernelCache,
    Toolchain,
    compile_c,
    kernel_key,
)
from hipress.compll.native import NativeBackend, build
from hipress.compll.render import generator_digest, render_c
from hipress.compll.source import SourceFile

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
    tpl = copy / "templates" / "c_loop.c.j2"
    tpl.write_text(tpl.read_text() + "\n")
    assert generator_digest("c", copy) != generator_digest("c")
    # a CUDA template change does not invalidate C kernels
    cu = copy / "templates" / "cuda_loop.cu.j2"
    tpl.write_text((root / "templates" / "c_loop.c.j2").read_text())
    cu.write_text(cu.read_text() + "\n")
    assert generator_digest("c", copy) == generator_digest("c")
    assert generator_digest("cuda", copy) != generator_digest("cuda")
    assert _key(_prog(), gen=generator_digest("c", copy)) == _key(_prog())


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
