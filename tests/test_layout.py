"""The package reads as the flow: every package imports only packages at or left of it in the import order, and
no import cycle, not even a hidden one.

IMPORT_ORDER is the order of docs/architecture.md's picture, left to right (a test reads the picture and checks that
both say the same). Each layer is one package or flat module, or a few that stand side by side: a package may import
packages of its own layer or of a layer to its left, never one to its right, except through the short, commented
ALLOWED_HIDDEN_EDGES (registries only: cli, levers, workloads).

Package graph: an edge A -> B when a module of A imports a module of B. Two graphs are checked:
- the import-time graph (the imports at the top of a file, the ones that run when A is imported; those under
  `if TYPE_CHECKING:` are for type checkers only and do not count): a cycle there is never allowed;
- the all-imports graph (every import statement, function-level ones and `if TYPE_CHECKING:` ones too): a cycle
  there is a layering bend hidden by a deferred import, allowed only for the edges in ALLOWED_HIDDEN_EDGES; the
  import order is checked on this graph too.
A function-level import of perflab's own code must say why on its line (a registry loaded by name, a launcher that
only a multi-process run needs, ...).
"""
from __future__ import annotations

import ast
from collections import defaultdict
from functools import lru_cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "perflab"


@lru_cache(maxsize=1)  # parsed once for all the tests of this file
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


# --- every import counted: cycles hidden by function-level imports ------------------------------------------------

# (importing file, package it imports) -> why the edge may close a cycle or point right in IMPORT_ORDER. Only the
# registries (levers, cli, workloads) may be reached this way; keep it short: each entry is a bend in the flow that the
# code has not straightened yet.
ALLOWED_HIDDEN_EDGES = {
    # tune's warm worker is a process entry point (`python -m perflab.tune.worker`) that runs each trial through the
    # CLI's command registry in-process (`perflab run|profile ...`); the CLI in turn registers `perflab tune`, and
    # report/ (which the CLI prints with) draws tune's tables (tune -> cli -> report -> tune). Moving the worker's
    # entry point under cli/ would remove this entry.
    ("perflab/tune/worker.py", "cli"),
}


def _imported_modules(node: ast.stmt, module: str, is_package: bool) -> list[str]:
    """The perflab modules an import statement names, relative imports resolved against `module`."""
    if isinstance(node, ast.ImportFrom) and node.level:
        parts = module.split(".")
        base = parts[: len(parts) - node.level + (1 if is_package else 0)]
        resolved = ".".join(base + ([node.module] if node.module else []))
        node = ast.ImportFrom(module=resolved, names=node.names, level=0)
    return _perflab_targets(node)


def all_imports_graph(allowed: frozenset = frozenset()) -> dict[str, dict[str, list[str]]]:
    """source package -> target package -> the import lines ("file:line -> module") that make the edge, counting
    every import statement anywhere in a file; imports in `allowed` ((file, target package) pairs) are left out."""
    edges: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path, tree in _modules().items():
        source = _file_unit(path)
        module = path[:-3].replace("/", ".")
        imports = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
        for node in sorted(imports, key=lambda node: node.lineno):
            for target in _imported_modules(node, module, path.endswith("__init__.py")):
                if _unit(target) != source and (path, _unit(target)) not in allowed:
                    edges[source][_unit(target)].append(f"{path}:{node.lineno} -> {target}")
    return edges


def import_cycles(edges: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """The strongly connected components of more than one package (each holds at least one cycle), sorted."""
    index: dict[str, int] = {}
    lowest: dict[str, int] = {}
    stack: list[str] = []
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = lowest[node] = len(index)
        stack.append(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                visit(target)
                lowest[node] = min(lowest[node], lowest[target])
            elif target in stack:
                lowest[node] = min(lowest[node], index[target])
        if lowest[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(set(edges) | {target for targets in edges.values() for target in targets}):
        if node not in index:
            visit(node)
    return sorted(components)


def _describe(component: list[str], edges: dict[str, dict[str, list[str]]]) -> str:
    """The packages of one component, then one cycle through them with the imports that make each of its edges."""
    inside = {source: {target for target in edges.get(source, ()) if target in component} for source in component}
    cycle = find_cycle(inside)
    lines = [f"{len(component)} packages: {', '.join(component)}", "  cycle: " + " -> ".join(cycle)]
    for source, target in zip(cycle, cycle[1:]):
        lines += [f"    {source} -> {target}: {where}" for where in edges[source][target]]
    return "\n".join(lines)


def test_import_cycles_finds_a_cycle_made_by_a_function_level_import_and_accepts_a_dag():
    edges = {"pipeline": {"memory": ["perflab/pipeline.py:251 -> perflab.memory.advice"]},
             "memory": {"pipeline": ["perflab/memory/step.py:32 -> perflab.pipeline"], "harness": ["..."]}}
    assert import_cycles(edges) == [["memory", "pipeline"]]
    assert import_cycles({"cli": {"pipeline": ["..."]}, "pipeline": {"harness": ["..."]}}) == []


def test_no_import_cycle_with_every_import_counted_but_the_allowed_registry_edges():
    edges = all_imports_graph(frozenset(ALLOWED_HIDDEN_EDGES))
    cycles = import_cycles(edges)
    assert not cycles, ("package import cycles, every import counted (break them by moving the shared piece down "
                        "or passing it in, not by hiding the import in a function):\n"
                        + "\n".join(_describe(component, edges) for component in cycles))


def test_every_allowed_hidden_edge_is_a_registry_the_code_still_imports():
    registries = {"levers", "cli", "workloads"}
    edges = all_imports_graph()
    stale = [(path, target) for path, target in ALLOWED_HIDDEN_EDGES
             if target not in registries or not any(where.startswith(f"{path}:")
                                                    for where in edges[_file_unit(path)].get(target, []))]
    assert not stale, f"allow-list entries that are not registries or no longer imported (remove them): {stale}"


# --- the import order: a package imports only packages at or left of it ------------------------------------------

DOC = PACKAGE.parent / "docs" / "architecture.md"

# Left to right, as docs/architecture.md draws it; packages are named without their slash, flat modules without .py,
# `perflab` is the package's own __init__ (the public API). A new package or flat module takes its place here and in
# the doc's picture.
IMPORT_ORDER: list[tuple[str, ...]] = [
    ("errors", "user_frames", "version", "environment", "options", "config", "ranks", "hooks", "backends",
     "bottlenecks", "cost", "stats", "oom"),  # the foundation: no perflab imports but each other
    ("models",),
    ("workloads",),
    ("results",),
    ("profile",),
    ("calibrate", "calibrate_collectives"),
    ("step",),
    ("generation",),
    ("levers",),
    ("harness",),
    ("diagnose",),
    ("compare", "quality", "checkpoint"),
    ("distributed",),
    ("prepare",),
    ("memory",),
    ("pipeline",),
    ("perflab",),
    ("script", "serve", "sweep", "tune"),  # the drivers
    ("report",),
    ("cli", "__main__"),
]


def doc_import_order() -> list[tuple[str, ...]]:
    """The layers of the doc's picture: its first fenced block, layers joined by `-->`, names split by spaces."""
    text = DOC.read_text()
    block = text.split("```", 2)[1].split("\n", 1)[1]  # the first fenced block, past its opening line
    return [tuple(name.rstrip("/").removesuffix(".py") for name in layer.split()) for layer in block.split("-->")]


def order_violations(edges: dict[str, dict[str, list[str]]], order: list[tuple[str, ...]]) -> list[str]:
    """Every import of a package to the right of the importer's layer, as "source -> target: file:line -> module"."""
    layer = {unit: index for index, units in enumerate(order) for unit in units}
    return [f"{source} -> {target}: {where}" for source, targets in sorted(edges.items())
            for target, wheres in sorted(targets.items())
            if layer.get(target, -1) > layer.get(source, len(order)) for where in wheres]  # unplaced: see below


def test_order_violations_finds_an_import_to_the_right_and_accepts_one_to_the_left_or_beside():
    order = [("errors", "options"), ("levers",), ("harness",)]
    edges = {"levers": {"harness": ["perflab/levers/plan.py:10 -> perflab.harness.plan"], "errors": ["..."]},
             "options": {"errors": ["..."]}, "harness": {"levers": ["..."]}}
    assert order_violations(edges, order) == ["levers -> harness: perflab/levers/plan.py:10 -> perflab.harness.plan"]


def test_the_doc_draws_the_import_order_the_layout_test_checks():
    assert doc_import_order() == IMPORT_ORDER, (
        "docs/architecture.md's picture and IMPORT_ORDER differ; change both together:\n"
        f"  doc:  {doc_import_order()}\n  test: {IMPORT_ORDER}")


def test_every_package_and_flat_module_has_one_place_in_the_import_order():
    placed = [unit for units in IMPORT_ORDER for unit in units]
    units = {_file_unit(path) for path in _modules()}
    assert sorted(set(placed)) == sorted(placed), "named twice in IMPORT_ORDER"
    assert not units - set(placed), f"not in IMPORT_ORDER (nor in the doc's picture): {sorted(units - set(placed))}"
    assert not set(placed) - units, f"in IMPORT_ORDER but not in perflab/: {sorted(set(placed) - units)}"


def test_every_package_imports_only_packages_at_or_left_of_it():
    violations = order_violations(all_imports_graph(frozenset(ALLOWED_HIDDEN_EDGES)), IMPORT_ORDER)
    assert not violations, ("imports of a package to the right in docs/architecture.md's order (move the shared "
                            "piece left, or pass it in):\n" + "\n".join(violations))
