"""The core's modules form a layered graph: no module reaches back, even through a lazy import.

Why count lazy (function-level) imports too: a cycle that holds only because one side imports
inside a function still ties the two modules into one unit that cannot be read or moved apart.
Imports under ``if TYPE_CHECKING:`` run no code, so they may point upward; but a cycle made of them
still says two modules cannot be understood apart, so cycles are checked with them too.
"""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[1] / "vgrpo_platform"


def _module_name(path: Path) -> str:
    parts = path.relative_to(CORE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(path: Path, modules: set[str], *, annotations: bool = False) -> set[str]:
    """Core modules that ``path`` imports anywhere outside a TYPE_CHECKING block (inside it too with
    ``annotations``)."""
    tree = ast.parse(path.read_text())
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node) and not annotations:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {m for m in found if m in modules} - {_module_name(path)}


def _graph(*, annotations: bool = False) -> dict[str, set[str]]:
    files = sorted(CORE.rglob("*.py"))
    modules = {_module_name(p) for p in files}
    return {_module_name(p): _imports(p, modules, annotations=annotations) for p in files}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
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
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            strong(v)
    return out


def test_the_cycle_finder_finds_a_constructed_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_core_modules_import_no_cycle() -> None:
    graph = _graph()
    loop = "vgrpo_platform.training.loop"
    assert loop in graph and graph[loop], "the scan found no imports"
    assert _cycles(graph) == []


def test_annotations_close_no_cycle_either() -> None:
    assert _cycles(_graph(annotations=True)) == []


# ------------------------------------------------------------------------------------------- layers
CONCEPTS = CORE.parent / "docs" / "concepts.md"
ENTRY_AND_ALIASES = {
    "vgrpo_platform.__main__",  # ``python -m vgrpo_platform``: the command line's entry, above everything
    "vgrpo_platform.plugins",  # deprecated re-exports kept for third-party plugins, not part of a layer
    "vgrpo_platform.lr_schedule",
    "vgrpo_platform.sampling",
    "vgrpo_platform.schedules",
}


def _map_rows() -> list[tuple[str, str]]:
    """``(folder, description)`` of each row of docs/concepts.md's map, top layer first."""
    text = CONCEPTS.read_text()
    table = text.split("<!-- map -->")[1]
    rows = []
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`") and cells[0].endswith("/`"):
            rows.append((cells[0].strip("`").rstrip("/"), cells[1]))
    return rows


def _layer_of(module: str, layers: list[str]) -> int:
    """Index of the deepest map folder holding ``module`` (the top level is the last layer)."""
    path = module.split(".")[1:]
    best = len(layers) - 1
    for i, folder in enumerate(layers):
        parts = folder.split("/")
        if folder != "vgrpo_platform" and path[: len(parts)] == parts:
            best = i
    return best


def _layers() -> list[str]:
    """The map's top-level folders in its order; sub-folders share their parent's layer."""
    return [f for f, _ in _map_rows() if "/" not in f]


def test_imports_go_down_the_documented_layers() -> None:
    layers = _layers()
    assert layers[-1] == "vgrpo_platform", "the map's last row is the top level"
    upward = []
    for module, imported in _graph().items():
        if module in ENTRY_AND_ALIASES:
            continue
        for target in imported:
            if _layer_of(target, layers) < _layer_of(module, layers):
                upward.append(f"{module} -> {target}")
    assert upward == [], "imports against the order of docs/concepts.md's map"


def test_the_layer_check_sees_an_upward_import() -> None:
    layers = ["cli", "training", "vgrpo_platform"]
    assert _layer_of("vgrpo_platform.training.loop", layers) == 1
    assert _layer_of("vgrpo_platform.errors", layers) == 2
    assert _layer_of("vgrpo_platform.errors", layers) > _layer_of("vgrpo_platform.cli.app", layers)


# ------------------------------------------------------------------------------------------- the map
def _tree() -> dict[str, set[str]]:
    """Each package folder of the core (relative, ``vgrpo_platform`` for the top) and its modules."""
    out: dict[str, set[str]] = {}
    for init in CORE.rglob("__init__.py"):
        folder = init.parent
        if "templates" in folder.relative_to(CORE).parts:
            continue
        key = "vgrpo_platform" if folder == CORE else folder.relative_to(CORE).as_posix()
        out[key] = {p.name for p in folder.glob("*.py") if p.name != "__init__.py"}
    return out


def test_the_concepts_map_names_every_folder_and_module_of_the_tree() -> None:
    rows = dict(_map_rows())
    tree = _tree()
    assert sorted(rows) == sorted(tree), "docs/concepts.md's map rows != the core's package folders"
    for folder, modules in tree.items():
        named = {m for m in modules if f"`{m}`" in rows[folder]}
        assert named == modules, f"{folder}: the map does not name {sorted(modules - named)}"
        for word in rows[folder].split("`")[1::2]:
            if word.endswith(".py") and "/" in word:
                assert (CORE / word).is_file(), f"the map names {word}, which does not exist"
            elif word.endswith(".py"):
                assert word in modules, f"the map names {folder}/{word}, which does not exist"
