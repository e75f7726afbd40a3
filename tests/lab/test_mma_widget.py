"""Notebook 10's widget (fovi_lab.lab.mma_viz.mma_widget / explore_mma_widget): a change of batch re-runs the real
kernel on Warp's CPU device and moves the figure, which marks the chosen batch and kernel on the recorded sweep
and shows the live time beside the recorded one."""

from __future__ import annotations

import json

import pytest

from fovi_lab.lab import mma_viz as mv
from fovi_lab.lab.labels import CONFIG_ID, kernel_label, short_label


def _figure(fig) -> dict:
    return json.loads(fig.to_json())


def _labels(fig: dict):
    """Every trace name and annotation a reader sees (config ids may sit in hover texts only)."""
    return [t.get("name") or "" for t in fig["data"]] + [a.get("text", "") for a in fig["layout"].get("annotations", [])]


def _marked(fig: dict, batch: int) -> dict:
    """The traces of ``fig`` that name ``batch``, by name."""
    return {t["name"]: t for t in fig["data"] if f"B = {batch}" in (t.get("name") or "")}


def test_a_change_of_batch_reruns_the_kernel_and_moves_the_figure():
    pytest.importorskip("ipywidgets")
    panel = mv.mma_widget("alex_L0", batch=16, device="cpu")      # opens with the default point already run
    lines16, fig16 = panel.last
    slider = panel.children[0].children[1]
    slider.value = 32                                             # what dragging the slider does
    lines32, fig32 = panel.last

    assert lines16[0].startswith("PASS") and lines32[0].startswith("PASS")
    pick16, pick32 = mv._rule_pick("alex_L0", 16), mv._rule_pick("alex_L0", 32)
    assert pick16 != pick32, "the rule picks another kernel at B = 32 on AlexNet's stem"
    assert f"the rule picks {short_label(pick16)}" in lines16[2] and f"the rule picks {short_label(pick32)}" in lines32[2]

    d16, d32 = _figure(fig16), _figure(fig32)
    assert d16["data"] != d32["data"]
    for d, b, pick in ((d16, 16, pick16), (d32, 32, pick32)):
        marked = _marked(d, b)
        line = marked[f"your batch: B = {b}"]                     # the dashed line at the chosen batch
        assert line["x"] == [b, b]
        star = marked[f"B = {b}: the kernel that ran, recorded"]  # the recorded replay of the pick at that batch
        assert star["x"] == [b] and star["y"][0] > 0 and pick in star["customdata"][0]
        bars = marked[f"B = {b}"]                                 # recorded H200 replay beside the live CPU time
        recorded, live = bars["y"]
        assert recorded == pytest.approx(star["y"][0]) and live > 0
        assert any(kernel_label(pick) in a["text"] for a in d["layout"]["annotations"])
        assert f"B = {b}" in d["layout"]["title"]["text"]
        assert not [m for text in _labels(d) for m in CONFIG_ID.findall(text)]
    # the live time is this run's, not a stored number
    assert f"{bars['y'][1]:.1f} ms" in lines32[1]


def test_a_refused_choice_still_marks_the_batch_without_a_live_time():
    lines, fig = mv.explore_mma_widget("alex_L1", 64, None, device="cpu", budget=1e6)
    assert "budget" in lines[0]
    d = _figure(fig)
    assert f"your batch: B = 64" in _labels(d)
    assert any("no live run" in a["text"] for a in d["layout"]["annotations"])
    assert all(t.get("y") is None or any(v for v in t["y"] if v) for t in d["data"])   # no empty trace
