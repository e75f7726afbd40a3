"""The learner's path (fovi_lab.lab.path): the README's notebooks table, the notebooks' file names, headings, path
lines and links all agree with the one list, and the check finds each kind of disagreement."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fovi_lab.lab import path as lp

ROOT = Path(__file__).resolve().parents[2]


def test_the_repository_agrees_with_the_list():
    assert lp.problems(ROOT) == []


def test_the_tool_checks_and_writes_nothing_when_all_agree():
    r = subprocess.run([sys.executable, "tools/learner_path.py"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0 and "the path agrees: 13 notebooks" in r.stdout, r.stdout + r.stderr


def test_the_list_is_the_reading_order():
    stems = [s.stem for s in lp.STEPS]
    assert [lp.number(s) for s in stems] == [f"{i:02d}" for i in range(1, len(stems) + 1)]
    assert stems == sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert len({s.title for s in lp.STEPS}) == len(stems)
    for i, s in enumerate(lp.STEPS):                        # what to read first comes earlier on the path
        assert all(r in stems[:i] or not re.match(r"\d\d_", r) for r in s.read_first), s.stem


def test_readme_table_rows_follow_the_list():
    text = (ROOT / "README.md").read_text()
    rows = text.split(lp.README_BEGIN + "\n", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    assert [re.search(r"`(\w+)`", r).group(1) for r in rows] == [s.stem for s in lp.STEPS]
    assert rows[0].split(" | ")[3] == "PyTorch" and rows[-1].split(" | ")[3] == "02, 09"
    cpu = json.loads((ROOT / "data" / "notebooks_cpu.json").read_text())["notebooks"]
    assert set(cpu) == {s.stem for s in lp.STEPS}


def test_every_notebook_links_its_neighbours():
    for i, s in enumerate(lp.STEPS):
        cells = lp.notebook_sources(ROOT / "notebooks" / f"{s.stem}.ipynb")
        first, last = cells[0][1], " ".join(cells[-1][1].split())
        assert first.startswith(f"# {lp.number(s.stem)} · {s.title}")
        assert f"Step {i + 1} of {len(lp.STEPS)}" in first and "Read first:" in first
        if i:
            assert f"Previous: [{lp.number(lp.STEPS[i - 1].stem)} · {lp.STEPS[i - 1].title}]" in last
        if i + 1 < len(lp.STEPS):
            assert f"Next: {lp.link(lp.STEPS[i + 1].stem)}" in last
        else:
            assert "Next:" not in last and "the last step" in last


def test_no_tracked_file_names_a_notebook_by_another_number():
    """A stale file name anywhere (README, docs, tests, tools, the package, the Makefile, the notebooks' records);
    this file names some on purpose, to break a scratch copy."""
    names = {s.stem.split("_", 1)[1]: s.stem for s in lp.STEPS}
    pattern = re.compile(r"\b(\d\d)_(" + "|".join(names) + r")\b")
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    stale = []
    for f in files:
        if f.startswith("fovi_lab/records/") or f == "tests/lab/test_learner_path.py" or not (ROOT / f).exists():
            continue
        try:
            text = (ROOT / f).read_text()
        except (UnicodeDecodeError, OSError):
            continue
        stale += [f"{f}: {m.group(0)}" for m in pattern.finditer(text) if names[m.group(2)] != m.group(0)]
    assert stale == []


@pytest.fixture()
def copy(tmp_path):
    """The README, the CPU times and the notebooks, in a scratch repository."""
    (tmp_path / "data").mkdir()
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    shutil.copy(ROOT / "data" / "notebooks_cpu.json", tmp_path / "data" / "notebooks_cpu.json")
    shutil.copytree(ROOT / "notebooks", tmp_path / "notebooks", ignore=shutil.ignore_patterns(".*"))
    assert lp.problems(tmp_path) == []
    return tmp_path


def _edit_cell(path, index, edit):
    nb = json.loads(path.read_text())
    src = "".join(nb["cells"][index]["source"])
    nb["cells"][index]["source"] = edit(src)
    path.write_text(json.dumps(nb, indent=1))


def test_the_check_finds_a_renamed_file(copy):
    (copy / "notebooks" / "04_weight_reuse.ipynb").rename(copy / "notebooks" / "02_weight_reuse.ipynb")
    found = lp.problems(copy)
    assert "notebooks/02_weight_reuse.ipynb is not on the path" in found
    assert "the path's step 04_weight_reuse has no notebooks/04_weight_reuse.ipynb" in found


def test_the_check_finds_a_wrong_link_and_a_next_line(copy):
    nb = copy / "notebooks" / "02_compact_forward.ipynb"
    _edit_cell(nb, 0, lambda s: s + "\n\nSee [06 · Tensor cores by hand](09_tensor_cores_by_hand.ipynb) and "
                                     "[notebook 07](08_eager_host_path.ipynb), [old](00_foveated_knn_graph.ipynb).")
    _edit_cell(nb, -1, lambda s: "Next: [04 · Weight reuse](04_weight_reuse.ipynb).\n\n" + s)
    found = lp.problems(copy)
    assert any("[06 · Tensor cores by hand] to 09_tensor_cores_by_hand.ipynb should say 09" in p for p in found)
    assert any("[notebook 07] to 08_eager_host_path.ipynb should say 08" in p for p in found)
    assert any("00_foveated_knn_graph.ipynb, not a notebook on the path" in p for p in found)
    assert any("'Next' line outside the path lines" in p for p in found)


def test_the_check_finds_edited_path_lines_heading_and_table(copy):
    nb = copy / "notebooks" / "07_training.ipynb"
    _edit_cell(nb, -1, lambda s: s.replace("Previous:", "Before this:"))
    _edit_cell(nb, 0, lambda s: s.replace("# 07 · Training", "# 05 · Training"))
    readme = copy / "README.md"
    readme.write_text(readme.read_text().replace("| 02, 07 |", "| 02 |"))
    found = lp.problems(copy)
    assert "notebooks/07_training.ipynb: its path lines differ from the list (python tools/learner_path.py " \
           "--write)" in found
    assert "notebooks/07_training.ipynb: its heading should start '# 07 · Training'" in found
    assert any(p.startswith("README.md: the notebooks table differs") for p in found)


def test_writing_the_path_lines_is_idempotent():
    for s in lp.STEPS:
        cells = lp.notebook_sources(ROOT / "notebooks" / f"{s.stem}.ipynb")
        once = lp.with_path_lines(s.stem, [cells[0][1], cells[-1][1]])
        assert lp.with_path_lines(s.stem, once) == once
        assert all(len(line) <= lp.WIDTH for block in (lp.head_block(s.stem), lp.foot_block(s.stem))
                   for line in block.splitlines())
