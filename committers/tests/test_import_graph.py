"""The layout stays true: rules on the import graph of ``framework`` and ``committers``, read
from the source with :mod:`ast` (nothing is imported).

An import counts wherever it is written (module level or inside a function: a lazy import is
still a dependency), except under ``if TYPE_CHECKING:``, which never runs. Tests are not part
of the graph: they may reach into private modules on purpose.

Imports of the product's own modules are written at module level (a module's dependencies are
read at its top), with one exception, :data:`LAZY_PRODUCT_IMPORTS`; and a private name
(``_name``) of a module is imported only from inside the package that holds the module.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("framework", "committers")

#: The only packages whose modules import pyspark: the framework's Spark runtime, the Delta
#: connector's Spark jobs (staging, rewrites, upsert planning) and its ``"deltalake"`` Spark
#: format (a Python data source and ``read_table``). Everything else runs without the engine.
PYSPARK_PACKAGES = ("framework.spark", "committers.delta.spark", "committers.delta.format")

#: Packages whose private modules form one unit: a private module may be imported from
#: anywhere inside the unit that holds it, and from nowhere else. The Delta connector's layers
#: share their private modules (their order is checked by ``DELTA_LAYERS``); the framework's
#: own root modules (``framework._crash``, ...) are shared by the framework's packages.
UNITS = (
    "framework.sink",
    "framework.source",
    "framework.asyncsink",
    "framework.retry",
    "framework.spark",
    "framework.testing",
    "framework",
    "committers.delta",
    "committers",
)

#: The Delta connector's layers and the layers each may import (see each subpackage's
#: docstring). ``sink`` is ``committers/delta/_sink.py``, which wires the layers into
#: :class:`DeltaSink`; the package's ``__init__`` and ``__main__`` may import anything.
DELTA_LAYERS: dict[str, set[str]] = {
    "storage": set(),
    "table": {"storage"},
    "read": {"storage", "table"},
    "write": {"storage", "table"},
    "spark": {"storage", "table", "read", "write"},
    "commit": {"storage", "table", "read", "write", "spark"},
    "sink": {"storage", "table", "read", "write", "spark", "commit"},
    "format": {"storage", "table", "read", "write", "spark", "commit", "sink"},
    "inspect": {"storage", "table", "read", "write", "spark", "commit", "sink"},
}


#: Product imports that must stay inside a function, and why: ``framework`` offers
#: ``TwoPhaseSink`` lazily so that importing the core never imports pyspark; the
#: ``"deltalake"`` format loads its writer (and with it the whole sink) only for a write, so
#: that the Python processes Spark starts for reads (a streaming read's runner, scan tasks)
#: do not import it (0.8 s of CPU each).
LAZY_PRODUCT_IMPORTS = {
    ("framework", "framework.spark"),
    ("committers.delta.format._format", "committers.delta.format._format_writer"),
}


def _modules() -> dict[str, Path]:
    """Every module of the product (tests excluded), by dotted name."""
    found = {}
    for package in PACKAGES:
        for path in (REPO_ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
            if "tests" in parts:
                continue
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _runtime_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements of ``tree`` that run (those under ``if TYPE_CHECKING:`` do not)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for other in node.orelse:
                yield from _runtime_imports(other)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        yield from _runtime_imports(node)


def _imported_names(node: ast.Import | ast.ImportFrom, current: str) -> Iterator[str]:
    """Dotted names an import statement may refer to (modules, or names in modules)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    module = node.module or ""
    if node.level:
        base = current.split(".")[: -node.level]
        module = ".".join([*base, module] if module else base)
    yield module
    yield from (f"{module}.{alias.name}" for alias in node.names)


def _function_level_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements of ``tree`` written inside a function (or a method)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield from _runtime_imports(node)


class Graph:
    def __init__(self) -> None:
        self.modules = _modules()
        #: module -> the product modules it imports
        self.edges: dict[str, set[str]] = {}
        #: module -> the top-level packages of third parties it imports
        self.external: dict[str, set[str]] = {}
        #: module -> the product modules it imports inside functions
        self.lazy: dict[str, set[str]] = {}
        #: module -> (the product module, the private name) of its ``from m import _name``
        self.private_names: dict[str, set[tuple[str, str]]] = {}
        for name, path in self.modules.items():
            # relative imports resolve against the package: a package's own __init__ is in it
            current = f"{name}.__init__" if path.name == "__init__.py" else name
            targets, external = set(), set()
            for node in _runtime_imports(ast.parse(path.read_text(), str(path))):
                for imported in _imported_names(node, current):
                    if imported in self.modules:
                        targets.add(imported)
                    elif imported.split(".")[0] not in PACKAGES:
                        external.add(imported.split(".")[0])
                # `from package import name`: an edge to `package` only if `name` is no module
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    submodules = {f"{node.module}.{a.name}" for a in node.names}
                    if submodules <= set(self.modules):
                        targets.discard(node.module)
            targets.discard(name)
            self.edges[name] = targets
            self.external[name] = external
            tree = ast.parse(path.read_text(), str(path))
            self.lazy[name] = {
                imported
                for node in _function_level_imports(tree)
                for imported in _imported_names(node, current)
                if imported in self.modules
            }
            self.private_names[name] = {
                (node.module, alias.name)
                for node in _runtime_imports(tree)
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                for alias in node.names
                if node.module in self.modules
                and alias.name.startswith("_")
                and not alias.name.startswith("__")
                and f"{node.module}.{alias.name}" not in self.modules
            }

    def cycles(self) -> list[list[str]]:
        """Strongly connected components of more than one module (Tarjan)."""
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        on_stack: set[str] = set()
        found: list[list[str]] = []

        def visit(v: str) -> None:
            index[v] = low[v] = len(index)
            stack.append(v)
            on_stack.add(v)
            for w in sorted(self.edges[v]):
                if w not in index:
                    visit(w)
                    low[v] = min(low[v], low[w])
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

        for v in sorted(self.edges):
            if v not in index:
                visit(v)
        return found


@pytest.fixture(scope="module")
def graph() -> Graph:
    return Graph()


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _unit(module: str) -> str:
    return next(u for u in UNITS if _inside(module, u))


def _private_owner(module: str) -> str | None:
    """The package whose private module ``module`` is (``None`` for a public module)."""
    parts = module.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:i])
    return None


def _delta_layer(module: str) -> str | None:
    """The layer of a module of ``committers.delta`` (``None`` outside it, or for the
    package's ``__init__`` and ``__main__``)."""
    parts = module.split(".")
    if parts[:2] != ["committers", "delta"] or len(parts) < 3:
        return None
    if parts[2] == "_sink":
        return "sink"
    return parts[2] if parts[2] in DELTA_LAYERS else None


def test_the_graph_is_read(graph: Graph) -> None:
    """The reader finds the edges the rules below rely on (a broken reader passes them all)."""
    assert "committers.delta.commit._committer" in graph.edges["committers.delta._sink"]
    assert "committers.delta.spark._upsert" in graph.edges["committers.delta._sink"]
    # a lazy import inside a function counts
    assert "framework.spark" in graph.edges["framework"]
    assert graph.lazy["framework"] == {"framework.spark"}
    assert "pyspark" in graph.external["committers.delta.spark._upsert"]
    # under TYPE_CHECKING does not
    assert "pyspark" not in graph.external["committers.delta._sink"]


def test_product_imports_are_at_module_level(graph: Graph) -> None:
    """A module's dependencies are read at its top: no import of the product's own modules
    hides inside a function (a lazy import that dodges an import circle or a layer rule)."""
    lazy = {(m, t) for m, targets in graph.lazy.items() for t in targets}
    assert sorted(lazy - LAZY_PRODUCT_IMPORTS) == []


def _package_of(module: str, graph: Graph) -> str:
    """The package a module belongs to (a package's ``__init__`` is in the package itself)."""
    if graph.modules[module].name == "__init__.py":
        return module
    return module.rpartition(".")[0]


def test_no_private_name_is_imported_from_another_package(graph: Graph) -> None:
    """``from package.module import _name`` only inside ``package``: what other packages use
    of a module is public (``table._rules.MIN_MICROS``, not ``_MIN_MICROS``)."""
    crossing = sorted(
        f"{module} -> {source}.{name}"
        for module, names in graph.private_names.items()
        for source, name in names
        if _package_of(source, graph) != _package_of(module, graph)
    )
    assert crossing == []


def test_no_import_cycles(graph: Graph) -> None:
    assert graph.cycles() == []


def test_pyspark_only_where_the_engine_is_needed(graph: Graph) -> None:
    importing = {m for m, external in graph.external.items() if "pyspark" in external}
    assert importing, "the reader found no pyspark import at all"
    outside = sorted(m for m in importing if not any(_inside(m, p) for p in PYSPARK_PACKAGES))
    assert outside == []


def test_no_private_module_is_imported_from_another_package(graph: Graph) -> None:
    """A private module (``_name``) is imported only from inside its unit; other packages go
    through the published API (``framework.spark.connector``, ``framework.connector``,
    ``framework.sink``, ...)."""
    crossing = []
    for module, targets in graph.edges.items():
        for target in targets:
            owner = _private_owner(target)
            if owner is not None and not _inside(module, _unit(owner)):
                crossing.append(f"{module} -> {target}")
    assert sorted(crossing) == []


def test_delta_layers_import_only_the_layers_below(graph: Graph) -> None:
    wrong = []
    for module, targets in graph.edges.items():
        layer = _delta_layer(module)
        if layer is None:
            continue
        for target in targets:
            other = _delta_layer(target)
            if other is not None and other != layer and other not in DELTA_LAYERS[layer]:
                wrong.append(f"{module} ({layer}) -> {target} ({other})")
    assert sorted(wrong) == []


def test_every_delta_layer_says_what_it_owns_and_may_import() -> None:
    delta = REPO_ROOT / "committers" / "delta"
    layers = {p.name for p in delta.iterdir() if (p / "__init__.py").is_file()}
    assert layers == set(DELTA_LAYERS) - {"sink"}
    for layer in layers:
        doc = ast.get_docstring(ast.parse((delta / layer / "__init__.py").read_text()))
        assert doc and "import" in doc, layer
