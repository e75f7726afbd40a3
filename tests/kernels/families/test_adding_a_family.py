"""Adding a forward family is its module, its rows in ``configs.toml`` and its line in the registry (the registry's
docstring says so). In a copy of the package: a family written as a module of its own (the SIMT family's parameters
under another key and variant, its kernels from the same kernel module), one experimental row, its import and its
entry in ``FAMILIES``, and nothing else. Its preset is then looked up, built, canary-checked and run by name on the
CPU, equal to the fp32 oracle."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import fovi_lab

FAMILY_MODULE = '''
"""A twin of the SIMT family under its own key and variant (the test of adding a family)."""

from fovi_lab.kernels.families.simt import Simt


class SimtTwin(Simt):
    key = "simt_twin"
    title = "SIMT register blocks, twin"
    variants = {"simtt": Simt._BASE}
    id_prefixes = {"simtt": "st_"}


FAMILY = SimtTwin()
'''

RUN = '''
import torch
from fovi_lab.graph.meta import build_meta, synthetic_graph
from fovi_lab.kernels import forward as F
from fovi_lab.kernels.families import family, lookup
from fovi_lab.ops.reference import oracle_forward

assert lookup("st_b4o4u1").owner is family("simt_twin")
idx, rf = synthetic_graph(40, 23, 5, 7, 9, seed=1)
meta = build_meta(idx, rf, cin=6, cout=9, v=7, nin=40)
g = torch.Generator().manual_seed(0)
x = torch.randn(5, 6, 40, generator=g).half()
w = (torch.randn(9, 42, generator=g) * 0.2).half()
y = F.run_uncached(x, w, None, meta.input_linear, meta.weight_linear, config="st_b4o4u1")
ref = oracle_forward(x, w, None, meta.idx, meta.rf_index, meta.v)
print("max error", float((y.float() - ref).abs().max()), "scale", float(ref.abs().max()))
'''


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, (path, old)
    path.write_text(text.replace(old, new))


def test_adding_a_family_is_its_module_its_rows_and_its_registry_line(tmp_path):
    copy = tmp_path / "fovi_lab"
    shutil.copytree(Path(fovi_lab.__file__).resolve().parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    families = copy / "kernels" / "families"
    (families / "simt_twin.py").write_text(FAMILY_MODULE)                                        # its module
    _edit(copy / "kernels" / "forward" / "configs.toml", "[experimental]\n",
          '[experimental]\nst_b4o4u1 = ["simtt", 4, 4, 1, 1, 128]\n')                              # its rows
    _edit(families / "registry.py", "import fovi_lab.kernels.families.simt as simt\n",
          "import fovi_lab.kernels.families.simt as simt\nimport fovi_lab.kernels.families.simt_twin as simt_twin\n")
    _edit(families / "registry.py", "    simt.FAMILY,\n", "    simt.FAMILY,\n    simt_twin.FAMILY,\n")  # its line
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(RUN)], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    words = done.stdout.split()
    err, scale = float(words[words.index("error") + 1]), float(words[words.index("scale") + 1])
    assert scale > 0.1 and err <= 2e-3 * scale, done.stdout

