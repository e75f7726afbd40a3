"""The stored outputs of the notebooks do not record a broken explanation.

nbval compares a notebook's outputs with the ones stored in it, so an output that was wrong when the notebook
was last executed (a source listing whose marked lines had moved away) passes every later run. The lab
prints such a failure in words (:func:`fovi_lab.lab.show_source`, :func:`fovi_lab.lab.missing_marks`); this
test reads the stored outputs for them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def _stream_text(path: Path):
    for i, cell in enumerate(json.loads(path.read_text())["cells"]):
        for out in cell.get("outputs", []):
            text = out.get("text") or out.get("data", {}).get("text/plain") or ""
            yield i, "".join(text) if isinstance(text, list) else text


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_source_listing_lost_its_marked_lines(path):
    bad = [(i, line) for i, text in _stream_text(path) for line in text.splitlines()
           if "points at lines that are no longer here" in line
           or ("every line the text points at is still in the source" in line and not line.endswith("True"))]
    assert bad == []


def test_the_check_reads_the_lab_s_own_words():
    from fovi_lab import lab
    text = lab.show_source(lab.setup, {"no such line in setup": "x"})
    assert "points at lines that are no longer here" in text
