"""The package's import graph, read from the source: no module imports itself back, not even
through a function-local import."""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "cfsl_jax"


def import_graph(root: pathlib.Path) -> dict[str, set[str]]:
    """module -> the package's modules it imports (anywhere in its source), by module name."""
    files = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        files[".".join(parts)] = path
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                while target and target not in files:
                    target = target.rpartition(".")[0]
                if (target and target != name and not name.startswith(target + ".")
                        and files[target].name != "__init__.py"):
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_package_has_no_import_cycle():
    graph = import_graph(PACKAGE)
    assert "cfsl_jax.training.loop" in graph and len(graph) > 40
    assert cycles(graph) == []


def test_the_cycle_check_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# The layers, bottom up (README, "Layout"): a module imports only from its own layer or below.
LAYERS = {"runtime": 0, "protocol": 1, "models": 2, "data": 2, "dataset_options": 2,
          "datasets": 2, "learners": 3, "training": 4, "fluid": 5, "experiments": 6}


def layer(module: str) -> str:
    return module.split(".")[1]


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((name, other) for name, imported in graph.items() for other in imported
                  if name.count(".") and other.count(".")
                  and LAYERS.get(layer(other), -1) > LAYERS.get(layer(name), 99))


def test_every_module_belongs_to_a_layer_and_nothing_imports_upward():
    graph = import_graph(PACKAGE)
    assert sorted({layer(name) for name in graph if name.count(".")} - set(LAYERS)) == []
    assert upward_imports(graph) == []


def test_the_layer_check_finds_an_upward_import():
    graph = {"cfsl_jax.protocol.episode": {"cfsl_jax.learners.shapes"},
             "cfsl_jax.learners.shapes": {"cfsl_jax.protocol.spec"},
             "cfsl_jax.protocol.spec": set(),
             "cfsl_jax.protocol.learner": {"cfsl_jax.models.norm"}, "cfsl_jax.models.norm": set()}
    assert upward_imports(graph) == [("cfsl_jax.protocol.episode", "cfsl_jax.learners.shapes"),
                                     ("cfsl_jax.protocol.learner", "cfsl_jax.models.norm")]
