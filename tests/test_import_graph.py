"""The package's import graph: no cycles, and no layer imports one above it.

Every ``import`` / ``from ... import`` of a ``fovi_lab`` module counts, at module level or inside a
function (a deferred import is still a dependency). Layers, bottom up: the graph (geometry, tables, the
layer table), the ops (reference ops, registry, autograd, dispatch), the Warp kernels, then benchmarks and
the lab (notebook support, demo, CLI). Optional backends are found by the registry by module name
(``fovi_lab.registry.OPTIONAL_BACKEND_MODULES``), which is not an import edge: the ops do not depend on
the kernels, the kernels register themselves.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "fovi_lab"

LAYERS = {
    "graph": {"geometry", "meta", "layers"},
    "ops": {"reference", "registry", "knn_autograd", "autotune", "graphs"},
    "kernels": {"warp_common", "warp_forward", "warp_mma", "warp_adjoint", "warp_adjoint_nm", "knn_warp"},
}
ORDER = ("graph", "ops", "kernels")


def _modules():
    mods = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG.parent).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        mods[".".join(parts)] = path
    return mods


def _edges(mods):
    edges = {m: set() for m in mods}
    for m, path in mods.items():
        package = m if path.name == "__init__.py" else m.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - node.level + 1]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            edges[m].update(t for t in targets if t in mods and t != m)
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
    mods = _modules()
    edges = _edges(mods)
    layer_of = {f"fovi_lab.{m}": layer for layer, names in LAYERS.items() for m in names}
    assert set(layer_of) <= set(mods), sorted(set(layer_of) - set(mods))
    upward = []
    for m, targets in edges.items():
        if m not in layer_of:
            continue
        for t in targets:
            # a module outside the three layers (benchmarks, the lab, the CLI) sits above all of them
            above = t not in layer_of and t != "fovi_lab" or \
                t in layer_of and ORDER.index(layer_of[t]) > ORDER.index(layer_of[m])
            if above:
                upward.append((m, t))
    assert upward == []
