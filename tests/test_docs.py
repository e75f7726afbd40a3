"""The docs the code points at exist: every ``docs/operator.md §N`` reference in the tree names a section of it."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REF = re.compile(r"docs/operator\.md §(\d+(?:\.\d+)?)")


def _sections():
    return {m.group(1) for m in re.finditer(r"^#{2,3} (\d+(?:\.\d+)?) ", (ROOT / "docs" / "operator.md").read_text(),
                                            re.M)}


def test_operator_doc_has_its_sections():
    assert {"1", "1.3", "2.1", "3.1", "4", "5", "6.5"} <= _sections()


def test_every_operator_reference_names_a_section():
    files = subprocess.run(["git", "ls-files", "fovi_lab", "tests", "notebooks", "tools", "README.md"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    sections, bad, seen = _sections(), [], 0
    for f in files:
        for m in REF.finditer((ROOT / f).read_text(errors="replace")):
            seen += 1
            if m.group(1) not in sections:
                bad.append(f"{f}: §{m.group(1)}")
    assert seen > 50 and bad == []


def test_readme_is_a_user_guide_of_at_most_250_lines():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    for section in ("## Set up", "## Open the lab", "## Using the ops", "## Results", "## Notebooks", "## Tests",
                    "## Package map"):
        assert section in text, section


# Lab history belongs in git, not in what users read: a sentence says what was measured and which record holds it.
HISTORY = re.compile(r"\bsession \d|\bruns? \d|\blease", re.I)
#: Records (data) keep their provenance fields, which may name the run that wrote them.
DATA_PREFIXES = ("data/", "fovi_lab/records/")


def _tracked_text():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for f in files:
        if f.startswith(DATA_PREFIXES):
            continue
        try:
            yield f, (ROOT / f).read_text()
        except (UnicodeDecodeError, OSError):
            continue                                   # binary files (images, gzip)


def test_no_lab_history_in_tracked_text():
    hits = {}
    for f, text in _tracked_text():
        found = [m.group(0) for m in HISTORY.finditer(text)]
        if found:
            hits[f] = found
    assert {f: h[:3] for f, h in hits.items()} == {}


def test_the_history_check_finds_its_words():
    sample = "; ".join(("ru" + "n 12", "Sess" + "ion 4's rule", "the le" + "ase", "release", "ru" + "ns 5-7"))
    assert [m.group(0) for m in HISTORY.finditer(sample)] == ["ru" + "n 1", "Sess" + "ion 4", "le" + "ase", "ru" + "ns 5"]
