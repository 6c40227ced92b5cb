"""The package's shape: folders follow the data path, lower layers never import upper
ones, and no module imports itself back through others (lazy imports included)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "h3flow"

# lowest first; a module may import its own layer and the ones below it
LAYERS = [
    {"core"},
    {"config"},
    {"handoff", "media", "reference"},
    {"engines"},
    {"planner"},
    {"pipeline"},
    {"ops"},
    {"cli"},
]
RANK = {folder: rank for rank, folders in enumerate(LAYERS) for folder in folders}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the h3flow modules it imports, wherever in the file the import is."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                candidates = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                candidates = [alias.name for alias in node.names]
            else:
                continue
            targets |= {c for c in candidates if c in modules and c != name}
        graph[name] = targets
    return graph


def layer(module: str) -> int | None:
    parts = module.split(".")
    return RANK.get(parts[1]) if len(parts) > 1 else None


def test_at_most_six_modules_sit_directly_in_the_package() -> None:
    loose = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(loose) <= 6, loose
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(RANK), f"every package folder has a layer: {folders ^ set(RANK)}"


def test_lower_layers_never_import_upper_ones() -> None:
    wrong = [
        f"{source} -> {target}"
        for source, targets in import_graph().items()
        for target in targets
        if layer(source) is not None and layer(target) is not None and layer(target) > layer(source)  # type: ignore[operator]
    ]
    assert not wrong, "\n".join(sorted(wrong))


def test_no_import_cycles() -> None:
    graph = import_graph()
    # a package's __init__ importing its own submodules is how packages expose names, not a cycle
    edges = {m: {t for t in ts if not t.startswith(m + ".")} for m, ts in graph.items()}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)
