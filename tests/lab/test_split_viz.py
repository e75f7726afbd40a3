"""Notebook 13 section 3 logic (fovi_lab.lab.split_viz): the thread arithmetic, the CPU run of the split kernel,
and the readers of the recorded H200 split-kernel sweeps."""

from __future__ import annotations

import plotly.graph_objects as go

from fovi_lab.lab import split_viz as sv
from fovi_lab.lab.labels import short_label


def test_thread_count_is_the_launch_arithmetic():
    r = sv.thread_count("res18_layer3", 16)
    assert r["unsplit_threads"] == 16 * 2 * 32 == 1024                       # Nout x B/8 x Cout/8
    assert r["pick"] == "ss_b8o8u4" and r["split"] == 32 and r["threads"] == 32 * 1024
    r = sv.thread_count("res18_layer1", 16)                                 # 230 nodes: the tiles keep B = 16
    assert r["pick"] == "nm_m16n32k64" and r["split"] is None


def test_explore_split_passes_on_the_cpu():
    res = sv.explore_split("res18_layer3", batch=3, device="cpu")
    assert res["config"] == "ss_b8o8u4" and res["split"] > 1
    assert res["line"].startswith("PASS") and res["bitwise_repeat"], res


def test_split_rows_read_the_recorded_runs():
    """The split-kernel sweeps: every layer has the split kernel, another Warp forward and PyTorch replayed at B = 1/4/16;
    where the heuristic picks the split kernel it is within 10 % of the fastest other Warp forward or faster
    (the rule's metric), and where it does not, the other forward is faster. The figure has 3 panels."""
    rows = sv.split_rows()
    assert {r["layer"] for r in rows} == set(sv.LAYERS) and len(rows) == 3 * len(sv.LAYERS)
    for r in rows:
        assert r["split_ms"] and r["other_ms"] and r["torch_ms"], (r["layer"], r["B"])
        assert all(rec["device"] == "NVIDIA H200" for rec in r["records"])
        if r["pick"] == r["split_config"]:
            assert r["split_ms"] <= 1.10 * r["other_ms"], (r["layer"], r["B"])
        else:
            assert r["other_ms"] < r["split_ms"], (r["layer"], r["B"])
    fig = sv.split_figure(rows)
    assert isinstance(fig, go.Figure) and len(fig.data) == 9
    assert "no recorded" in sv.split_figure([]).layout.annotations[0].text


def test_thread_sweep_rows_hold_three_targets():
    rows = sv.thread_sweep_rows()
    assert rows and all(set(r["ms_by_threads"]) == {8192, 32768, 131072} for r in rows if r["B"] in (1, 16))
    l2 = next(r for r in rows if (r["layer"], r["B"], r["config"]) == ("alex_L2", 1, "ss_b4o8u4"))
    assert l2["ms_by_threads"][131072] < l2["ms_by_threads"][32768]        # why 4x8 blocks get 131072


def test_explore_split_widget_runs_and_refuses_clearly():
    lines, fig = sv.explore_split_widget("res18_layer3_0", 5, "ss_b4o8u4", device="cpu")
    assert lines[0].startswith("PASS") and "bitwise-identical on a second call: True" in lines[1], lines
    assert f"the heuristic picks {short_label('ss_b8o8u4')}" in lines[2] and len(fig.data) == 4          # 3 recorded series + the chosen batch
    lines, _ = sv.explore_split_widget("alex_L1", 64, device="cpu")              # 18 GFLOP: over the budget
    assert len(lines) == 1 and "budget" in lines[0]
    lines, fig = sv.explore_split_widget("res18_layer3", 0, "ss_b16o8u2", device="cpu")
    assert any("batch must be" in line for line in lines) and any("config must be" in line for line in lines)
    assert "no recorded" in sv.explore_split_widget("nope", 1)[1].layout.annotations[0].text


def test_partial_traffic_and_vec4_w_rows():
    t = sv.thread_count("res18_layer3", 16)
    p = sv.partial_traffic("res18_layer3", 16, hbm_tbps=4.0)
    assert p["split"] == t["split"] and p["mb"] == 4e-6 * t["split"] * 16 * t["cout"] * t["nout"]
    assert p["us"] == 2 * p["mb"] / 4.0
    assert sv.partial_traffic("alex_L0", 16)["mb"] == 0           # the rule does not split there
    rows = sv.vec4_w_rows()
    assert rows and [r["ratio"] for r in rows] == sorted(r["ratio"] for r in rows)
    assert all(r["config"].split("_", 1)[1] == r["base"].split("_", 1)[1] for r in rows)
