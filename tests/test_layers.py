"""The import graph of ``hipress/``: no cycles, and no module importing a later layer.

Every import counts, at module level or inside a function (a lazy import is still a
dependency); only imports under ``if TYPE_CHECKING:`` are left out. A module's layer is the
longest prefix of its name in :data:`LAYERS`; a module may import its own layer and the layers
before it.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "hipress"

# Bottom to top. Within one entry, modules may import each other (but never in a cycle).
LAYERS: list[tuple[str, ...]] = [
    ("hipress.core", "hipress.timing"),
    ("hipress.compll.ir",),
    ("hipress.compll.frontend",),
    ("hipress.compll.lower",),
    ("hipress.compll.backends",),
    ("hipress.compll",),  # the compiler's API: load, Algorithm, the codegen CLI helpers
    ("hipress.secopa",),  # the cost model, the planner, profiling of codecs and links
    ("hipress.casync",),
    ("hipress.horovod", "hipress.integrations", "hipress.fsdp"),  # Horovod, Lightning, ...
    ("hipress.bench", "hipress.demo", "hipress.selftest", "hipress.cli", "hipress"),
]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The hipress modules ``path`` imports (a ``from pkg import mod`` names ``pkg.mod``)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("hipress"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            if base.startswith("hipress"):
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    out.add(sub if sub in known else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    out.discard(name)
    return out


@functools.cache
def _graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in ROOT.rglob("*.py")}
    known = set(files)
    return {name: _imports(path, name, known) & known for name, path in files.items()}


def _layer(module: str) -> int:
    best, rank = -1, -1
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, rank = len(p), i
    assert rank >= 0, f"{module} is in no layer: add it to LAYERS"
    return rank


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (a list of modules, the first repeated last), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return [*stack[stack.index(n) :], n]
            if n not in state and (found := dfs(n)) is not None:
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := dfs(m)) is not None:
            return found
    return None


def test_the_graph_is_read() -> None:
    graph = _graph()
    assert len(graph) > 50
    assert any(m.startswith("hipress.compll") for m in graph["hipress.casync.algorithm"])


def test_no_import_cycles() -> None:
    # a package's __init__ importing its own modules (and they importing the package for a
    # name it re-exports) is how Python packages are built; cycles among modules are not
    graph = _graph()
    flat = {m: {n for n in deps if not _is_package_of(n, m)} for m, deps in graph.items()}
    cycle = _cycle(flat)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def _is_package_of(pkg: str, module: str) -> bool:
    return (ROOT.parent / pkg.replace(".", "/") / "__init__.py").exists() and module.startswith(
        pkg + "."
    )


@pytest.mark.parametrize("module", sorted(_graph()))
def test_imports_follow_the_layers(module: str) -> None:
    graph = _graph()
    mine = _layer(module)
    against = sorted(n for n in graph[module] if _layer(n) > mine)
    assert not against, f"{module} (layer {LAYERS[mine]}) imports a later layer: {against}"
