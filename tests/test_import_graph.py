"""No import circles in the package: the modules' imports (at the top and inside functions alike) form no cycle. A
circle hides which module is the lower layer (checkpoints imported the models that import the checkpoint checks; the
GPU adapter imported the op that imports it) and breaks as soon as one of its imports moves to the top of a file."""
import ast
from pathlib import Path
from typing import Dict, List, Set

from tests.pages import ROOT

PACKAGE = ROOT / "fairseq_linattn"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> Dict[str, Set[str]]:
    """module -> the package's modules it imports (``from . import x`` names the module x, not the package)."""
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: Dict[str, Set[str]] = {name: set() for name in files}

    def known(name: str) -> str:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name

    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base for alias in node.names]
            else:
                continue
            graph[name] |= {known(t) for t in targets if known(t) and known(t) != name}
    return graph


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    found: List[List[str]] = []

    def visit(v: str):
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_package_has_no_import_circles():
    graph = import_graph()
    assert "fairseq_linattn.checkpoints.fit" in graph["fairseq_linattn.models.plugin_model"]  # the graph sees imports
    assert cycles(graph) == []


def test_a_circle_would_be_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
