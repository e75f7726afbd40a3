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


_DATA_KEYS = ("y", "x", "z", "values", "r", "cells")


def _finite(v) -> bool:
    """Whether a trace field holds at least one finite number (nested lists and plotly's typed arrays too)."""
    if isinstance(v, bool) or v is None:
        return False
    if isinstance(v, (int, float)):
        return v == v and v not in (float("inf"), float("-inf"))
    if isinstance(v, dict):                       # {"dtype": ..., "bdata": ...}: plotly's binary arrays
        return bool(v.get("bdata")) or any(_finite(x) for x in v.values() if isinstance(x, (list, dict)))
    if isinstance(v, (list, tuple)):
        return any(_finite(x) for x in v)
    return False


def _figures(path: Path):
    for i, cell in enumerate(json.loads(path.read_text())["cells"]):
        for out in cell.get("outputs", []):
            fig = out.get("data", {}).get("application/vnd.plotly.v1+json")
            if fig is not None:
                yield i, fig


def empty_traces(fig: dict):
    """The names of a stored plotly figure's traces with no finite number in any data field."""
    bad = []
    for t in fig.get("data", []):
        fields = [t.get(k) for k in _DATA_KEYS if k in t]
        if t.get("type") == "table":
            fields = [t.get("cells", {}).get("values")]
        if not any(_finite(f) for f in fields):
            bad.append(t.get("name") or t.get("type") or "?")
    return bad


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_figure_shows_data(path):
    """Every trace of every figure a notebook shows has finite data, and no figure is a bare message: an empty
    figure passes nbval (it compares no plot data), so this reads the stored outputs."""
    bad = []
    for i, fig in _figures(path):
        if not fig.get("data"):
            texts = [a.get("text", "") for a in fig.get("layout", {}).get("annotations", [])]
            bad.append((i, "no traces", texts[:1]))
        elif empty_traces(fig):
            bad.append((i, empty_traces(fig)[:3]))
    assert bad == []


def test_the_figure_check_finds_an_empty_trace():
    assert empty_traces({"data": [{"type": "bar", "name": "a", "y": [None, None]},
                                  {"type": "bar", "name": "b", "y": [1.0, None]}]}) == ["a"]
    assert empty_traces({"data": [{"type": "scatter", "y": {"dtype": "f8", "bdata": "AAAA"}}]}) == []
