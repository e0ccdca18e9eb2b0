"""The distribution ships every package of the source tree (pyproject lists them by hand, so a
new subpackage left out of the list would import from a checkout and fail from a wheel)."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_is_in_pyproject() -> None:
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        ".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "hipress").rglob("__init__.py")
    }
    assert found - listed == set(), "packages missing from pyproject.toml"
    assert listed - found == {"hipress.algorithms"}


def test_package_data_is_declared() -> None:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    data = data["package-data"]
    for pkg, patterns in data.items():
        folder = (
            ROOT / "algorithms" if pkg == "hipress.algorithms" else ROOT / pkg.replace(".", "/")
        )
        for pattern in patterns:
            assert list(folder.glob(pattern)), f"{pkg}: nothing matches {pattern}"
    for suffix in ("*.lark", "*.h", "*.j2"):
        for f in (ROOT / "hipress").rglob(suffix):
            pkg = ".".join(f.parent.relative_to(ROOT).parts)
            assert suffix in data.get(pkg, []), f"{f} is not declared as package data of {pkg}"
