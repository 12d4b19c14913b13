"""The module import graph of ``hpcgpu`` and ``apps`` has no cycles (function-local imports included).

A cycle papered over by an import inside a function still couples two modules both ways; this test
reads every module with :mod:`ast` and counts every ``import`` statement, wherever it sits. An edge
``a -> b`` means that importing (or running) ``a`` imports ``b``:

- ``import p.q.m`` and ``from p.q import m`` (``m`` a module) give ``a -> p.q.m``; ``from p.q import name``
  (``name`` not a module) gives ``a -> p.q``; relative imports are resolved against ``a``'s package;
- importing ``p.q.m`` also runs the ``__init__`` of ``p`` and ``p.q``: those count too, except packages
  that contain ``a`` itself (they are being imported already when ``a`` runs).

Strongly connected components with more than one module are cycles. :data:`KNOWN_CYCLES` may list a
cycle in files another team is changing at the moment, each with its reason; any other cycle fails.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("hpcgpu", "apps")

#: Cycles allowed for now, each a set of modules (a cycle found must lie within one of them), with the
#: reason as a comment. Empty since issue 23: the last ones (hpcgpu.particles <-> particles.ghosts,
#: apps.md.resident <-> resident_slab, apps.train.distributed <-> peer_reduce <-> zero,
#: apps.stencil.sphere.polar_filter <-> polar_filter_gpu, hpcgpu.app.environment <-> summary) are gone.
KNOWN_CYCLES: list[set[str]] = []


def module_files() -> dict[str, Path]:
    """``{dotted module name: path}`` of every module under :data:`PACKAGES` (packages by their ``__init__``)."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _resolve_relative(module: str, is_package: bool, level: int, target: str | None) -> str:
    package = module.split(".") if is_package else module.split(".")[:-1]
    base = package[: len(package) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def imported_modules(module: str, path: Path, modules: dict) -> set[str]:
    """The modules of ``modules`` that ``module`` imports anywhere in its source (see the module docstring)."""
    is_package = path.name == "__init__.py"
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = _resolve_relative(module, is_package, node.level, node.module)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                targets.add(submodule if submodule in modules else base)
    edges = set()
    own_packages = {".".join(module.split(".")[:n]) for n in range(1, module.count(".") + (2 if is_package else 1))}
    for target in targets:
        parts = target.split(".")
        for n in range(1, len(parts) + 1):
            name = ".".join(parts[:n])
            if name in modules and name != module and (name == target or name not in own_packages):
                edges.add(name)
    return edges


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {module: imported_modules(module, path, modules) for module, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, components = {}, {}, set(), [], []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)
    return components


def test_the_cycle_finder_finds_a_cycle_hidden_in_a_function(tmp_path):
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [{"a", "b", "c"}]
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "one.py").write_text("from . import two\n")
    (package / "two.py").write_text("def later():\n    from pkg.one import thing\n")
    modules = {"pkg": package / "__init__.py", "pkg.one": package / "one.py", "pkg.two": package / "two.py"}
    graph = {name: imported_modules(name, path, modules) for name, path in modules.items()}
    assert graph == {"pkg": set(), "pkg.one": {"pkg.two"}, "pkg.two": {"pkg.one"}}
    assert cycles(graph) == [{"pkg.one", "pkg.two"}]


def test_hpcgpu_and_apps_have_no_import_cycles():
    graph = import_graph()
    assert "hpcgpu.transport.selection" in graph and "apps.md.resident_slab" in graph
    new = [sorted(component) for component in cycles(graph)
           if not any(component <= known for known in KNOWN_CYCLES)]
    assert not new, (
        f"import cycles: {new}. Expected none: move what both modules need into a third module (or the "
        "lower layer) instead of importing inside a function; see tests/imports/test_import_graph.py")
