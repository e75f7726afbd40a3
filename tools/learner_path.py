"""Write (``--write``) or check (``--check``, the default) what the learner's path list says, from
``fovi_lab/lab/path.py``: the README's notebooks table (with the CPU seconds of ``data/notebooks_cpu.json``), the
line under each notebook's heading (its step, what to read first) and the line that ends it (previous, next).

    python tools/learner_path.py --write     # after editing the list or the CPU times
    python tools/learner_path.py             # lists each disagreement; exit status 1 if there is one

Only markdown cells change: no notebook needs re-executing after ``--write``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from fovi_lab.lab import path as lp  # noqa: E402


def cpu_seconds() -> dict:
    f = ROOT / "data" / "notebooks_cpu.json"
    return json.loads(f.read_text()).get("notebooks", {}) if f.exists() else {}


def write() -> list:
    """Write the README table and every notebook's path lines; the files changed."""
    changed = []
    readme = ROOT / "README.md"
    text = readme.read_text()
    new = lp.with_readme_table(text, cpu_seconds())
    if new != text:
        readme.write_text(new)
        changed.append("README.md")
    for s in lp.STEPS:
        path = ROOT / "notebooks" / f"{s.stem}.ipynb"
        nb = nbformat.read(path, as_version=4)
        first, last = nb.cells[0], nb.cells[-1]
        if first.cell_type != "markdown" or last.cell_type != "markdown":
            raise SystemExit(f"{path.relative_to(ROOT)}: its first and last cells should be markdown")
        head, foot = lp.with_path_lines(s.stem, [first.source, last.source])
        if (head, foot) != (first.source, last.source):
            first.source, last.source = head, foot
            nbformat.write(nb, path)
            changed.append(str(path.relative_to(ROOT)))
    return changed


def main(argv) -> int:
    if "--write" in argv:
        for f in write():
            print(f"wrote {f}")
    found = lp.problems(ROOT, cpu_seconds())
    for p in found:
        print(p)
    if not found:
        print(f"the path agrees: {len(lp.STEPS)} notebooks, the README table, headings and links")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
