"""The package's import graph: no cycles, and no layer imports one above it.

Every ``import`` / ``from ... import`` of a ``fovi_lab`` module counts, at module level or inside a
function (a deferred import is still a dependency). Layers, bottom up, one folder each: ``settings`` (one module:
the ``FOVI_*`` environment variables, importing nothing of the package), ``graph/`` (geometry, the layer table,
index tables), ``ops/`` (reference ops, registry, dispatch, autograd),
``kernels/`` (Warp only), the applications (``bench/``, ``train``), ``lab/`` (notebook support), and the
entry points (demo, CLI). Optional backends are found by the registry by module name
(``fovi_lab.ops.registry.OPTIONAL_BACKEND_MODULES``), which is not an import edge: the ops do not depend on
the kernels, the kernels register themselves.

Inside ``kernels/`` the parts are ordered too, bottom up: the shared modules (``common``, ``built``, ``layout``,
``tables``, ``experiments``), ``families/`` (what each kernel is: parameters, limits, estimates), ``forward/`` and
``adjoint/`` (the kernels and how a call runs them), and the modules over all of them (``call_plan``, the cost model,
``warmup``). A family makes its kernels with the factories of the module its caller passes (``Family.make_kernel``),
so no family imports a kernel module; and no import crosses parts inside a function, where a cycle would hide.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "fovi_lab"

# Bottom up. A module's layer is its folder (``fovi_lab.graph.meta`` is in "graph"); ``fovi_lab.settings`` is its own
# layer; another top-level module is listed by name. ``knn_warp`` is the Warp backend's public surface (the seed's
# names), a kernels module.
ORDER = ("settings", "graph", "ops", "kernels", "apps", "lab", "entry")
TOP_LEVEL = {"knn_warp": "kernels", "bench": "apps", "train": "apps", "explanation": "apps", "integrations": "apps",
             "demo": "entry", "cli": "entry", "__main__": "entry"}


#: The parts of ``kernels/``, bottom up; a module directly in ``kernels/`` is "shared" when listed in KERNEL_SHARED,
#: else "top".
KERNEL_PARTS = ("shared", "families", "forward", "adjoint", "top")
KERNEL_SHARED = {"common", "built", "layout", "tables", "experiments"}


def layer_of(module: str):
    """The layer of a ``fovi_lab`` module, or None for the package itself (its public API re-exports)."""
    parts = module.split(".")
    if len(parts) == 1:
        return None
    if parts[1] in ORDER:
        return parts[1]
    return TOP_LEVEL[parts[1]]


def kernel_part(module: str, mods):
    """The part of ``kernels/`` a module is in (:data:`KERNEL_PARTS`), or None outside ``kernels/`` (and for the
    ``kernels`` package itself)."""
    parts = module.split(".")
    if parts[:2] != ["fovi_lab", "kernels"] or len(parts) < 3:
        return None
    if len(parts) == 3 and mods[module].name != "__init__.py":
        return "shared" if parts[2] in KERNEL_SHARED else "top"
    return parts[2]


def _kernel_imports(mods):
    """``(module, target, deferred)`` for every import of one ``kernels/`` module by another in another part;
    ``deferred``: the import sits inside a function."""
    out = []
    for m, path in sorted(mods.items()):
        if kernel_part(m, mods) is None:
            continue
        tree = ast.parse(path.read_text())
        deferred = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                    for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}
        for node in ast.walk(tree):
            for t in _targets(node, m, path):
                if t in mods and t != m and kernel_part(t, mods) not in (None, kernel_part(m, mods)):
                    out.append((m, t, id(node) in deferred))
    return out


def _modules():
    mods = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG.parent).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        mods[".".join(parts)] = path
    return mods


def _targets(node, module: str, path: Path):
    """The module names an import statement ``node`` of ``module`` (at ``path``) may import: the module it names
    and, for ``from m import a``, ``m.a`` (a submodule, if it is one)."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = package.split(".")[:len(package.split(".")) - node.level + 1]
            mod = ".".join(base + ([node.module] if node.module else []))
        else:
            mod = node.module or ""
        return [mod] + [f"{mod}.{a.name}" for a in node.names]
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    return []


def _edges(mods):
    edges = {m: set() for m in mods}
    for m, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            edges[m].update(t for t in _targets(node, m, path) if t in mods and t != m)
    return edges


def _cycles(edges):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    assert _cycles(_edges(_modules())) == []


def test_the_cycle_finder_finds_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_layer_imports_one_above_it():
    edges = _edges(_modules())
    upward = sorted((m, t) for m, targets in edges.items() for t in targets
                    if layer_of(m) and layer_of(t) and ORDER.index(layer_of(t)) > ORDER.index(layer_of(m)))
    assert upward == []


def test_only_the_lab_imports_the_lab():
    edges = _edges(_modules())
    outside = sorted((m, t) for m, targets in edges.items() for t in targets
                     if layer_of(t) == "lab" and layer_of(m) != "lab")
    assert outside == []


def test_no_kernel_part_imports_one_above_it():
    mods = _modules()
    upward = sorted((m, t) for m, t, _ in _kernel_imports(mods)
                    if KERNEL_PARTS.index(kernel_part(t, mods)) > KERNEL_PARTS.index(kernel_part(m, mods)))
    assert upward == []


def test_no_deferred_import_crosses_kernel_parts():
    assert sorted((m, t) for m, t, deferred in _kernel_imports(_modules()) if deferred) == []


def test_every_kernel_module_has_a_part():
    mods = _modules()
    assert {kernel_part(m, mods) for m in mods if m.startswith("fovi_lab.kernels.")} == set(KERNEL_PARTS)


def test_the_kernel_part_check_sees_a_deferred_import(tmp_path):
    # a family that imported its kernel module inside make_kernel: deferred, and upward
    pkg = tmp_path / "fovi_lab" / "kernels"
    (pkg / "families").mkdir(parents=True)
    (pkg / "forward").mkdir()
    (pkg / "families" / "x.py").write_text("def make_kernel():\n    import fovi_lab.kernels.forward.tile as T\n")
    (pkg / "forward" / "tile.py").write_text("")
    mods = {"fovi_lab.kernels.families.x": pkg / "families" / "x.py",
            "fovi_lab.kernels.forward.tile": pkg / "forward" / "tile.py"}
    assert _kernel_imports(mods) == [("fovi_lab.kernels.families.x", "fovi_lab.kernels.forward.tile", True)]
    assert kernel_part("fovi_lab.kernels.forward.tile", mods) == "forward"


def test_every_module_has_a_layer():
    assert all(layer_of(m) in ORDER for m in _modules() if m != "fovi_lab")


def test_the_layer_check_sees_an_upward_import():
    # the checks above would pass vacuously if layer_of put everything in one layer
    assert ORDER.index(layer_of("fovi_lab.kernels.forward.api")) > ORDER.index(layer_of("fovi_lab.graph.meta"))
    assert layer_of("fovi_lab.lab.records") == "lab" and layer_of("fovi_lab.bench.forward") == "apps"


def test_every_import_of_a_package_name_resolves():
    """Deferred imports (inside functions) run only when their function does: check each names something."""
    import importlib
    missing = []
    for m, path in sorted(_modules().items()):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("fovi_lab"):
                mod = importlib.import_module(node.module)
                for a in node.names:
                    if not hasattr(mod, a.name):
                        try:
                            importlib.import_module(f"{node.module}.{a.name}")
                        except ImportError:
                            missing.append(f"{m}: from {node.module} import {a.name}")
    assert missing == []
