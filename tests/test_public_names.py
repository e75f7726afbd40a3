"""The notebooks and the lab use only public names of the package's modules.

A private (underscore) name is an implementation detail its module may rename or drop; a notebook or a lab
module that reaches for one would break silently with the next refactor, and would teach the wrong API.
Checked statically (ast): ``from fovi_lab... import _x`` and ``alias._x`` where ``alias`` is bound to a
``fovi_lab`` module, in every code cell of ``notebooks/*.ipynb`` and every module of ``fovi_lab/lab/``.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(source: str, own_module: str = "") -> list:
    """``(line, text)`` of each private name of another ``fovi_lab`` module used in ``source``."""
    tree = ast.parse(source)
    aliases = {}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fovi_lab"):
            for a in node.names:
                if _private(a.name) and node.module != own_module:
                    found.append((node.lineno, f"from {node.module} import {a.name}"))
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("fovi_lab"):
                    aliases[a.asname or a.name.split(".")[0]] = a.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases \
                and _private(node.attr) and aliases[node.value.id] != own_module:
            found.append((node.lineno, f"{node.value.id}.{node.attr}"))
    return sorted(set(found))


def _notebook_code(path: Path) -> str:
    cells = json.loads(path.read_text())["cells"]
    lines = []
    for cell in cells:
        if cell["cell_type"] == "code":
            src = "".join(cell["source"])
            lines += ["" if l.lstrip().startswith(("%", "!")) else l for l in src.splitlines()]
    return "\n".join(lines)


def test_notebooks_use_only_public_names():
    bad = {p.name: private_uses(_notebook_code(p)) for p in sorted((ROOT / "notebooks").glob("*.ipynb"))}
    assert {k: v for k, v in bad.items() if v} == {}


def test_the_lab_uses_only_public_names_of_other_modules():
    bad = {}
    for p in sorted((ROOT / "fovi_lab" / "lab").glob("*.py")):
        mod = "fovi_lab.lab." + p.stem if p.stem != "__init__" else "fovi_lab.lab"
        uses = private_uses(p.read_text(), own_module=mod)
        if uses:
            bad[p.name] = uses
    assert bad == {}


def test_the_check_finds_private_names():
    src = ("from fovi_lab.kernels import forward as F\nfrom fovi_lab.kernels.forward.plans import _Plan\n"
           "import fovi_lab.lab.records as R\nF._KERNELS\nF.run_uncached\nR._sweep_run(1)\nF.__name__\n")
    assert private_uses(src) == [(2, "from fovi_lab.kernels.forward.plans import _Plan"), (4, "F._KERNELS"),
                                 (6, "R._sweep_run")]
