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

The same graph, seen one level up, checks the layers of ``hpcgpu`` (:data:`LAYERS`): every subpackage or
top-level module of ``hpcgpu`` has a layer, imports only from its own layer and the layers below, and no
two of them depend on each other, directly or through others. At that level an import also counts when
it is hidden from ``import`` statements: ``hpcgpu.NAME`` (or ``from hpcgpu import NAME``) of the lazy
public names counts as an import of the module that defines ``NAME``, and a module that imports
dynamically (``importlib``, ``__import__``) imports every module its string constants name. Nothing in
``hpcgpu`` imports ``apps``, statically or dynamically: an app plugs in through the entry points it
declares (``pyproject.toml``).

An app split into folders has layers of its own (:data:`APP_LAYERS`; ``apps.train``: kernels and data <- nn <-
training <- parallel <- run <- app; ``apps.stencil``: shared pieces <- swe_scheme <- the models (jacobi, heat3d,
channel, sphere) <- app), checked by the same rules.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("hpcgpu", "apps")

#: Cycles allowed for now, each a set of modules (a cycle found must lie within one of them), with the
#: reason as a comment. Empty since issue 23: the last ones (hpcgpu.particles <-> particles.ghosts,
#: apps.md.resident <-> resident_slab, apps.train.parallel.distributed <-> peer_reduce <-> zero,
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


# ------------------------------------------------------------------ layers of hpcgpu
#: The layers of ``hpcgpu``, lowest first: each names what lies directly in ``hpcgpu/`` (a subpackage, or a
#: module without its ``.py``). A part may import from its own layer and from the layers below it, never
#: from a layer above, and the parts form no cycle (within a layer neither). ``docs/architecture.md`` draws
#: the same order. The package's own ``__init__`` (``import hpcgpu``) is the public facade above all of them:
#: it imports nothing when imported and names the public classes lazily (see the module docstring).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("errors", "provenance", "locations")),
    ("runtime", ("runtime",)),                   # Communicator, device pick by node-local rank, abort, capture
    ("architecture", ("arch",)),                 # CPU or GPU: xp, streams; built on runtime's device pick
    ("transport", ("transport",)),
    ("decomposition", ("decomposition", "reductions")),  # blocks, shape, node layout; reproducible sums
    ("halo", ("halo",)),
    ("fields and particles", ("field", "particles")),
    ("kernel layer", ("stencils",)),
    ("files", ("output",)),                      # crash-safe record files, atomic writes, fsync
    ("checkpoint", ("checkpoint",)),
    ("job services", ("observe", "health")),     # info, GPU monitor, NVML readings, --profile; health checks
    ("app contract", ("app",)),                  # CLI, run control, timers, progress, summary
    ("simulation", ("simulation",)),             # the driver and its operations (NetCDFOutput among them)
    ("tools", ("bench", "testing", "jobs", "__main__")),  # benchmarks, test helpers, launcher and job scripts
]

#: Imports from a layer up that exist today, each ``(importing part, imported part)`` with its reason. Each
#: entry must still be true (a test says when it is gone: then delete it here); any other one fails.
KNOWN_UPWARD: set[tuple[str, str]] = set()

#: Calls and imports that load a module named by a string.
_DYNAMIC_IMPORTERS = {"importlib", "__import__", "runpy", "pkgutil"}
_MODULE_NAME = re.compile(r"(hpcgpu|apps)(\.[A-Za-z_]\w*)*")


def _docstring_nodes(tree: ast.AST) -> set[int]:
    """ids of the string constants that are bare statements (docstrings and the like): not module names."""
    return {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}


def imports_dynamically(tree: ast.AST) -> bool:
    """Whether a module can import by name: it uses importlib, __import__, runpy or pkgutil."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] in _DYNAMIC_IMPORTERS for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in _DYNAMIC_IMPORTERS:
            return True
        if isinstance(node, ast.Name) and node.id == "__import__":
            return True
    return False


def named_modules(tree: ast.AST, modules: dict) -> set[str]:
    """Modules named by the string constants of ``tree`` (not its docstrings): ``"apps.md"``, ``"hpcgpu.x.y"``,
    and the fixed start of an f-string (``f"apps.{name}"`` names ``apps``). A name is cut back to the
    longest prefix that is a module of ``modules``; anything under ``apps`` counts even when not a module."""
    skip = _docstring_nodes(tree)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if _MODULE_NAME.fullmatch(node.value):
                names.add(node.value)
        elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            start = str(node.values[0].value)
            if _MODULE_NAME.fullmatch(start.rstrip(".")) and start.endswith("."):
                names.add(start.rstrip("."))
    found = set()
    for name in names:
        parts = name.split(".")
        prefixes = [".".join(parts[:n]) for n in range(len(parts), 0, -1)]
        module = next((prefix for prefix in prefixes if prefix in modules), None)
        if module is not None:
            found.add(module)
        elif parts[0] == "apps":
            found.add(name)
    return found


def lazy_public_names(root: Path = ROOT) -> dict[str, str]:
    """``{NAME: module}`` of ``hpcgpu.NAME``, read from the facade's ``_LAZY`` table (without importing it)."""
    tree = ast.parse((root / "hpcgpu" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(target, "id", None) == "_LAZY" for target in node.targets):
            return {name: module for name, (module, _attribute) in ast.literal_eval(node.value).items()}
    raise AssertionError("hpcgpu/__init__.py has no _LAZY table of public names")


def facade_uses(tree: ast.AST, public: dict[str, str]) -> set[str]:
    """Modules reached through the facade: ``hpcgpu.NAME`` and ``from hpcgpu import NAME`` of lazy names."""
    found = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "hpcgpu"
                and node.attr in public):
            found.add(public[node.attr])
        elif isinstance(node, ast.ImportFrom) and node.module == "hpcgpu" and not node.level:
            found.update(public[alias.name] for alias in node.names if alias.name in public)
    return found


@functools.lru_cache(maxsize=1)
def full_import_graph() -> dict[str, frozenset[str]]:
    """:func:`import_graph` plus the imports through the facade and by name (see the module docstring);
    read once per session."""
    modules = module_files()
    graph = import_graph()
    public = lazy_public_names()
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        graph[module] |= facade_uses(tree, public)
        if imports_dynamically(tree):
            graph[module] |= named_modules(tree, modules) - {module}
    return {module: frozenset(targets) for module, targets in graph.items()}


def part_of(module: str) -> str | None:
    """The part of hpcgpu a module belongs to (``hpcgpu.halo.exchange`` -> ``halo``); None for the facade
    ``hpcgpu`` itself and for anything outside hpcgpu."""
    parts = module.split(".")
    return parts[1] if parts[0] == "hpcgpu" and len(parts) > 1 else None


def part_edges(graph: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    """``{(part, imported part): ["module -> imported module", ...]}`` between different parts of hpcgpu."""
    edges: dict[tuple[str, str], list[str]] = {}
    for module, targets in graph.items():
        for target in targets:
            source_part, target_part = part_of(module), part_of(target)
            if source_part and target_part and source_part != target_part:
                edges.setdefault((source_part, target_part), []).append(f"{module} -> {target}")
    return {edge: sorted(lines) for edge, lines in edges.items()}


def layer_index() -> dict[str, int]:
    return {part: index for index, (_name, parts) in enumerate(LAYERS) for part in parts}


def upward(edges, layers: dict[str, int]) -> dict[tuple[str, str], list[str]]:
    """The edges that go from a layer to a layer above it."""
    return {(a, b): lines for (a, b), lines in edges.items() if layers[b] > layers[a]}


def test_hidden_imports_are_found(tmp_path):
    """A name given to importlib and a lazy public name count as imports; a docstring does not."""
    modules = {"hpcgpu": Path(), "hpcgpu.low": Path(), "apps": Path(), "apps.toy": Path()}
    tree = ast.parse('''"""Loads ``apps.toy`` at run time."""
import importlib
PLUGINS = ("apps.toy.recipe", "hpcgpu.low.detail")
def load(name):
    return importlib.import_module(f"apps.{name}.recipe")
''')
    assert imports_dynamically(tree)
    assert named_modules(tree, modules) == {"apps.toy", "hpcgpu.low", "apps"}
    plain = ast.parse('''"""Runs ``python -m apps.toy``: a process, not an import."""
import subprocess
subprocess.run(["python", "-m", "apps.toy"])
''')
    assert not imports_dynamically(plain)
    facade = ast.parse("import hpcgpu\nfrom hpcgpu import Field, __version__\ncomm = hpcgpu.Communicator()\n")
    public = {"Field": "hpcgpu.field", "Communicator": "hpcgpu.runtime.communicator"}
    assert facade_uses(facade, public) == {"hpcgpu.field", "hpcgpu.runtime.communicator"}
    layers = {"low": 0, "high": 1}
    edges = part_edges({"hpcgpu.low.a": {"hpcgpu.high"}, "hpcgpu.high": {"hpcgpu.low.a", "hpcgpu"}})
    assert edges == {("low", "high"): ["hpcgpu.low.a -> hpcgpu.high"], ("high", "low"): ["hpcgpu.high -> hpcgpu.low.a"]}
    assert upward(edges, layers) == {("low", "high"): ["hpcgpu.low.a -> hpcgpu.high"]}


def test_every_part_of_hpcgpu_has_one_layer():
    parts = {path.stem for path in (ROOT / "hpcgpu").glob("*.py") if path.name != "__init__.py"}
    parts |= {path.name for path in (ROOT / "hpcgpu").iterdir() if (path / "__init__.py").is_file()}
    listed = [part for _name, layer_parts in LAYERS for part in layer_parts]
    assert len(listed) == len(set(listed)), f"a part listed in two layers: {sorted(listed)}"
    assert not parts - set(listed), (
        f"{sorted(parts - set(listed))}: not in any layer. Add each to LAYERS in tests/imports/test_import_graph.py "
        "(the lowest layer above everything it imports) and to the layer diagram of docs/architecture.md")
    assert not set(listed) - parts, f"{sorted(set(listed) - parts)}: in LAYERS but not in hpcgpu/ any more"


def test_no_part_of_hpcgpu_imports_from_a_layer_above_it():
    layers = layer_index()
    found = upward(part_edges(full_import_graph()), layers)
    new = {edge: lines for edge, lines in found.items() if edge not in KNOWN_UPWARD}
    assert not new, "imports from a layer above:\n" + "\n".join(
        f"  {a} (layer {LAYERS[layers[a]][0]!r}) -> {b} (layer {LAYERS[layers[b]][0]!r}): {'; '.join(lines)}"
        for (a, b), lines in sorted(new.items())) + (
        "\nExpected each part to import only from its own layer and the ones below (LAYERS in "
        "tests/imports/test_import_graph.py): move what the lower part needs down, or pass it in as an argument.")


def test_the_known_upward_imports_are_still_there():
    """An entry of KNOWN_UPWARD whose import is gone must go too, so that it cannot come back unnoticed."""
    layers = layer_index()
    found = upward(part_edges(full_import_graph()), layers)
    gone = sorted(KNOWN_UPWARD - set(found))
    assert not gone, f"{gone}: no import from a layer above any more. Delete them from KNOWN_UPWARD in " \
                     "tests/imports/test_import_graph.py"


def test_the_parts_of_hpcgpu_form_no_cycle():
    """No part depends on itself through another (sideways imports within a layer included)."""
    edges = part_edges(full_import_graph())
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        if (a, b) not in KNOWN_UPWARD:
            graph.setdefault(a, set()).add(b)
            graph.setdefault(b, set())
    found = cycles(graph)
    assert not found, "parts of hpcgpu that depend on each other: " + "; ".join(
        " <-> ".join(sorted(component)) for component in found) + " (edges: " + "; ".join(
        line for (a, b), lines in sorted(edges.items()) for line in lines
        if any({a, b} <= component for component in found)) + ")"


def test_hpcgpu_never_imports_apps():
    """Not with ``import``, not by name through importlib: an app registers itself (entry points)."""
    graph = full_import_graph()
    found = sorted(f"{module} -> {target}" for module, targets in graph.items() if module.startswith("hpcgpu")
                   for target in targets if target == "apps" or target.startswith("apps."))
    assert not found, (f"hpcgpu imports apps: {found}. Expected none: the framework must work without the "
                       "bundled apps; let the app register what hpcgpu needs through an entry point "
                       "(pyproject.toml [project.entry-points]) or pass it in")


# ------------------------------------------------------------------ layers inside an app
#: The folders of each app that has them, lowest first, in the same form as :data:`LAYERS`: each names what
#: lies directly in ``apps/NAME/`` (a subpackage, or a module without its ``.py``). The rules are those of
#: hpcgpu's layers: import from your own layer and the ones below, no cycle between parts. Each folder's
#: ``__init__`` docstring says the same in words, and ``docs/architecture.md`` draws it.
APP_LAYERS: dict[str, list[tuple[str, tuple[str, ...]]]] = {
    "train": [
        ("kernels and data", ("kernels", "data")),      # CuPy/Numba kernels, array helpers; MNIST-1D, shards
        ("network", ("nn",)),                           # layers, models, loss over flat buffers
        ("one rank's step", ("training",)),             # precision, optimiser, train_step, checkpoint payload
        ("parallelism", ("parallel",)),                 # data, tensor, pipeline parallelism, sharded state
        ("the run", ("run",)),                          # the Simulation models, the plot
        ("the app", ("app", "__main__", "scaling_recipe")),
    ],
    "stencil": [
        ("shared pieces", ("checkpointing", "snapshots", "region_kernels", "peer_rows", "pingpong")),
        ("the shallow-water scheme", ("swe_scheme",)),  # one C-grid scheme for both grids; knows no grid
        ("models", ("jacobi", "heat3d", "channel", "sphere")),  # heat3d reuses jacobi; the two SWE grids
        ("the app", ("app", "__main__", "scaling_recipe")),
    ],
}


def app_part_of(app: str):
    """``module -> part`` of ``apps.APP`` (``apps.train.nn.layers`` -> ``nn``); None for the app's own
    ``__init__`` and for anything outside the app."""
    prefix = ["apps", app]

    def part(module: str) -> str | None:
        parts = module.split(".")
        return parts[2] if parts[:2] == prefix and len(parts) > 2 else None
    return part


def app_part_edges(app: str, graph) -> dict[tuple[str, str], list[str]]:
    """:func:`part_edges` between the parts of ``apps.APP``."""
    part = app_part_of(app)
    edges: dict[tuple[str, str], list[str]] = {}
    for module, targets in graph.items():
        for target in targets:
            source_part, target_part = part(module), part(target)
            if source_part and target_part and source_part != target_part:
                edges.setdefault((source_part, target_part), []).append(f"{module} -> {target}")
    return {edge: sorted(lines) for edge, lines in edges.items()}


def test_an_upward_import_between_app_folders_is_found():
    graph = {"apps.toy.low.a": {"apps.toy.high.b", "hpcgpu.x"}, "apps.toy.high.b": {"apps.toy.low"},
             "apps.toy": set(), "apps.toy.app": {"apps.toy.high.b"}}
    edges = app_part_edges("toy", graph)
    assert edges == {("low", "high"): ["apps.toy.low.a -> apps.toy.high.b"],
                     ("high", "low"): ["apps.toy.high.b -> apps.toy.low"],
                     ("app", "high"): ["apps.toy.app -> apps.toy.high.b"]}
    assert upward(edges, {"low": 0, "high": 1, "app": 2}) == {("low", "high"): ["apps.toy.low.a -> apps.toy.high.b"]}


@pytest.mark.parametrize("app", sorted(APP_LAYERS))
def test_every_folder_of_an_app_has_one_layer_and_says_what_it_may_import(app):
    root = ROOT / "apps" / app
    parts = {path.stem for path in root.glob("*.py") if path.name != "__init__.py"}
    packages = {path.name for path in root.iterdir() if (path / "__init__.py").is_file()}
    listed = [part for _name, layer_parts in APP_LAYERS[app] for part in layer_parts]
    assert len(listed) == len(set(listed)), f"a part of apps.{app} listed in two layers: {sorted(listed)}"
    assert set(listed) == parts | packages, (
        f"apps.{app}: {sorted((parts | packages) - set(listed))} in no layer, {sorted(set(listed) - parts - packages)} "
        f"listed but gone. Expected APP_LAYERS[{app!r}] in tests/imports/test_import_graph.py to name every "
        "subpackage and top-level module once (the lowest layer above everything it imports)")
    undocumented = sorted(name for name in packages if ast.get_docstring(ast.parse((root / name / "__init__.py")
                                                                                   .read_text())) is None)
    assert not undocumented, (f"apps/{app}/{undocumented}/__init__.py: no docstring. Expected one saying what lives "
                              "there and which folders it may import")


@pytest.mark.parametrize("app", sorted(APP_LAYERS))
def test_no_folder_of_an_app_imports_from_a_layer_above_or_in_a_cycle(app):
    layers = {part: index for index, (_name, parts) in enumerate(APP_LAYERS[app]) for part in parts}
    edges = app_part_edges(app, full_import_graph())
    found = upward(edges, layers)
    assert not found, f"apps.{app}: imports from a layer above:\n" + "\n".join(
        f"  {a} (layer {APP_LAYERS[app][layers[a]][0]!r}) -> {b} (layer {APP_LAYERS[app][layers[b]][0]!r}): "
        f"{'; '.join(lines)}" for (a, b), lines in sorted(found.items())) + (
        f"\nExpected each folder of apps/{app} to import only from its own layer and the ones below (APP_LAYERS "
        "in tests/imports/test_import_graph.py): move what the lower folder needs down, or pass it in.")
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    assert not cycles(graph), f"apps.{app}: folders that depend on each other: {cycles(graph)}"
