"""The package reads as the flow: no import cycle between perflab's packages, and no hidden one.

Package graph: an edge A -> B when a module of A imports a module of B at the top of its file (the imports
that run when A is imported). Imports inside `if TYPE_CHECKING:` are for type checkers only and do not count.
A function-level import of perflab's own code hides an edge from this graph, so each one must say why on its
line (a registry loaded by name, a launcher that only a multi-process run needs, ...).
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "perflab"


def _modules() -> dict[str, ast.Module]:
    return {str(path.relative_to(PACKAGE.parent)): ast.parse(path.read_text()) for path in sorted(PACKAGE.rglob("*.py"))}


def _unit(module: str) -> str:
    """perflab.harness.loop -> harness; perflab.pipeline -> pipeline; perflab -> perflab."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _file_unit(path: str) -> str:
    module = path[:-3].replace("/", ".")
    return _unit(module[: -len(".__init__")] if module.endswith(".__init__") else module)


def _perflab_targets(node: ast.stmt) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name.startswith("perflab")]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "perflab":
        return [f"perflab.{alias.name}" for alias in node.names]  # `from perflab import options`: the module
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.startswith("perflab"):
        return [node.module]
    return []


def _import_time_statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """Statements that run when the module is imported: its body, into if/try blocks, not into functions or classes,
    and not into `if TYPE_CHECKING:`."""
    found = []
    for node in body:
        found.append(node)
        if isinstance(node, ast.If):
            if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                found += _import_time_statements(node.body) + _import_time_statements(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *[handler.body for handler in node.handlers]):
                found += _import_time_statements(block)
    return found


def _in_functions(tree: ast.Module) -> list[ast.stmt]:
    return [node for function in ast.walk(tree) if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef))
            for node in ast.walk(function) if isinstance(node, (ast.Import, ast.ImportFrom))]


def package_graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for path, tree in _modules().items():
        source = _file_unit(path)
        for node in _import_time_statements(tree.body):
            for target in _perflab_targets(node):
                if _unit(target) != source:
                    edges[source].add(_unit(target))
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str]:
    """One cycle as a path [a, b, ..., a], or [] when the graph has none (depth-first search)."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = "open"
        stack.append(node)
        for target in sorted(edges.get(node, ())):
            if state.get(target) == "open":
                return stack[stack.index(target):] + [target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        state[node] = "done"
        stack.pop()
        return []

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []


def test_find_cycle_finds_a_planted_cycle_and_accepts_a_dag():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"cli": {"pipeline", "report"}, "pipeline": {"harness"}, "report": {"results"},
                       "harness": {"results"}}) == []


def test_the_package_import_graph_has_no_cycle():
    cycle = find_cycle(package_graph())
    assert not cycle, "package import cycle: " + " -> ".join(cycle)


def test_every_function_level_import_of_perflab_says_why():
    unexplained = []
    for path, tree in _modules().items():
        lines = (PACKAGE.parent / path).read_text().splitlines()
        for node in _in_functions(tree):
            if not _perflab_targets(node):
                continue
            if "#" not in lines[node.lineno - 1] and "#" not in lines[node.end_lineno - 1]:
                unexplained.append(f"{path}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    assert not unexplained, "function-level imports with no reason on their line:\n" + "\n".join(unexplained)
