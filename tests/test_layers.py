"""The import graph of ``hipress/``: no cycles, and no module importing a later layer.

Every import counts, at module level or inside a function (a lazy import is still a
dependency), and so do imports under ``if TYPE_CHECKING:`` (a reader follows them like any
other): the layers hold for all of them; run-time imports have no cycle at all, and
annotation-only ones none but those in :data:`ANNOTATION_CYCLES`. A module's layer is the
longest prefix of its name in :data:`LAYERS`; a module may import its own layer and the layers
before it. Within the compiler's backends, each target's folder (its renderer and its runner)
imports no other target (:data:`TARGET_FOLDERS`). No integration imports another
(:data:`INTEGRATIONS`): what they share is in the codec layer below them.
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
    ("hipress.secopa.model",),  # SeCoPa's pure cost model: profiles, formulas, the planner
    # SeCoPa's online profiling (codecs, links, calibration, the plan broadcast) and its API;
    # below the codec layer and CaSync, whose plan="auto" calls it (CaSync's step probe passed in)
    ("hipress.secopa.measure", "hipress.secopa"),
    ("hipress.codec",),  # what every sync shares: algorithm, flags, checkpoints, errors, plans
    # CaSync, and the reader of the step timelines its tracer writes (`hipress trace`)
    ("hipress.casync", "hipress.timeline"),
    ("hipress.horovod", "hipress.integrations", "hipress.fsdp", "hipress.diloco"),
    ("hipress.bench", "hipress.demo", "hipress.selftest", "hipress.cli", "hipress"),
]

# Cycles through annotation-only imports not yet broken (each listed cycle may shrink or go,
# no other may appear): replace the annotation by a protocol, or move the shared types.
ANNOTATION_CYCLES: tuple[frozenset[str], ...] = ()

# Each target's folder of the backends: its renderer and its runner. A target imports the
# C-family base (backends.cfamily) and the shared modules, never another target; the base and
# the shared modules import no target, but for the CLI's table and the backend selector.
TARGET_FOLDERS = ("hipress.compll.backends.c", "hipress.compll.backends.cuda")
IMPORT_EVERY_TARGET = ("hipress.compll.backends.targets", "hipress.compll.backends.select")

# The integrations: each builds on the codec layer (hipress.codec), none on another. The framework
# wrappers (hipress.integrations: Lightning, Accelerate) register the DDP hook, so they alone
# may import hipress.casync.
INTEGRATIONS = (
    "hipress.casync", "hipress.fsdp", "hipress.horovod", "hipress.integrations", "hipress.diloco",
)  # fmt: skip
MAY_IMPORT = {"hipress.integrations": ("hipress.casync",)}


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


def _imports(path: Path, name: str, known: set[str], annotations: bool) -> set[str]:
    """The hipress modules ``path`` imports (a ``from pkg import mod`` names ``pkg.mod``);
    with ``annotations``, those imported under ``if TYPE_CHECKING:`` too."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if not annotations and isinstance(node, ast.If) and _is_type_checking(node):
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
def _graph(annotations: bool = True) -> dict[str, set[str]]:
    """Module -> the hipress modules it imports (with ``annotations``: under
    ``if TYPE_CHECKING:`` too)."""
    files = {_module_name(p): p for p in ROOT.rglob("*.py")}
    known = set(files)
    return {name: _imports(path, name, known, annotations) & known for name, path in files.items()}


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
    assert any(m.startswith("hipress.compll") for m in graph["hipress.codec.algorithm"])


def _flat(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    # a package's __init__ importing its own modules (and they importing the package for a
    # name it re-exports) is how Python packages are built; cycles among modules are not
    return {m: {n for n in deps if not _is_package_of(n, m)} for m, deps in graph.items()}


def test_no_import_cycles() -> None:
    cycle = _cycle(_flat(_graph(annotations=False)))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_cycles_through_annotation_only_imports_but_those_listed() -> None:
    graph = _flat(_graph())
    # the modules of a listed cycle may import each other; no module may join them in one
    pruned = {
        m: {n for n in deps if not any({m, n} <= c for c in ANNOTATION_CYCLES)}
        for m, deps in graph.items()
    }
    cycle = _cycle(pruned)
    assert cycle is None, "import cycle (annotation-only imports count): " + " -> ".join(
        cycle or []
    )


def _target(module: str) -> str | None:
    return next((t for t in TARGET_FOLDERS if module == t or module.startswith(t + ".")), None)


@pytest.mark.parametrize(
    "module", [m for m in sorted(_graph()) if m.startswith("hipress.compll.backends.")]
)
def test_a_target_imports_no_other_target(module: str) -> None:
    mine = _target(module)
    if module in IMPORT_EVERY_TARGET:
        return
    others = sorted(n for n in _graph()[module] if _target(n) not in (None, mine))
    assert not others, f"{module} imports another target's modules: {others}"


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


def _integration(module: str) -> str | None:
    return next((i for i in INTEGRATIONS if module == i or module.startswith(i + ".")), None)


@pytest.mark.parametrize("module", [m for m in sorted(_graph()) if _integration(m)])
def test_no_integration_imports_another(module: str) -> None:
    mine = _integration(module)
    assert mine is not None
    allowed = (None, mine, *MAY_IMPORT.get(mine, ()))
    others = sorted(n for n in _graph()[module] if _integration(n) not in allowed)
    assert not others, f"{module} imports another integration: {others}"


@pytest.mark.parametrize(
    "path", sorted(ROOT.joinpath("secopa", "model").rglob("*.py")), ids=lambda p: p.stem
)
def test_the_pure_cost_model_imports_no_process_group(path: Path) -> None:
    # SeCoPa's model measures nothing: a plan from a profile needs no torch.distributed
    # (and, by LAYERS, nothing of hipress.secopa.measure)
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    assert not {n for n in names if n.startswith("torch.distributed")}, path
