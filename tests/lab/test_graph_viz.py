"""Headless tests of notebook 01's figures and widget callback (fovi_lab.lab.graph_viz)."""

import json

import numpy as np
import plotly.graph_objects as go
import pytest

from fovi_lab.lab import graph_viz as gv
from fovi_lab.graph.geometry import foveated_knn_graph


@pytest.fixture(scope="module")
def graph():
    return foveated_knn_graph(a=0.5, k=25, in_stride=2, out_stride=4, ref_frame_mult=1.0)


def _names(fig):
    return [t.name for t in fig.data]


def test_grid_figure(graph):
    fig = gv.grid_figure(graph)
    assert isinstance(fig, go.Figure) and not isinstance(fig, go.FigureWidget)
    assert _names(fig)[:3] == ["input nodes", "output nodes", "padding band"]
    assert len(fig.data[0].x) == graph.nin and len(fig.data[1].x) == graph.nout
    assert len(fig.data[2].x) == len(graph.pad_coords)
    scene = [t for t in fig.data if t.type == "scatter3d"]
    assert len(scene) == 1 and len(scene[0].z) == graph.nin
    assert np.allclose(np.asarray(scene[0].z, dtype=np.float64), graph.in_cortical[:, 2], atol=1e-4)
    # same grid: no separate output trace
    same = foveated_knn_graph(a=0.5, k=9, in_stride=8, out_stride=8)
    assert "output nodes" not in _names(gv.grid_figure(same, show_pad=False))


def test_neighbourhood_figure(graph):
    node = graph.nout - 1  # an edge node: it has pad neighbours
    fig = gv.neighbourhood_figure(graph, node)
    names = _names(fig)
    assert {"neighbours", "pad neighbours", "output node", "taps (reference grid)"} <= set(names)
    npad = int((graph.idx[node] == graph.nin).sum())
    assert npad > 0
    pad_trace = fig.data[names.index("pad neighbours")]
    real_trace = fig.data[names.index("neighbours")]
    assert len(pad_trace.x) == npad and len(real_trace.x) == graph.k - npad
    taps = fig.data[names.index("taps (reference grid)")]
    assert len(taps.x) == graph.v
    offsets = fig.data[-1]
    assert list(offsets.marker.color) == graph.rf_index[node].tolist()
    assert np.allclose(np.asarray(offsets.x, dtype=np.float64), graph.local_offsets[node, :, 0], atol=1e-4)
    widths = list(offsets.marker.line.width)
    assert sum(w > 0 for w in widths) == int(graph.collided[node].sum())
    grid = fig.data[names.index(f"output nodes, stride {graph.out_stride / graph.in_stride:g}")]
    xy = np.stack([np.asarray(grid.x, dtype=np.float64), np.asarray(grid.y, dtype=np.float64)], axis=1)
    assert np.abs(xy - graph.out_coords[node]).sum(axis=1).min() < 1e-3            # the node is one of them
    assert len(grid.x) >= 2 and gv.output_spacing(graph, node) > 0
    with pytest.raises(IndexError):
        gv.neighbourhood_figure(graph, graph.nout)


def test_index_tables_figure(graph):
    meta = graph.meta(3, 8)
    fig = gv.index_tables_figure(meta, nodes=[0, graph.nout - 1])
    assert [t.type for t in fig.data] == ["heatmap", "heatmap"]
    il = np.array(fig.data[0].z, dtype=np.float64)
    wl = np.array(fig.data[1].z)
    assert il.shape == wl.shape == (2, meta.p64)
    expect = meta.input_linear[[0, graph.nout - 1]].numpy()
    pad = expect == meta.pad_column
    assert np.array_equal(np.isnan(il), pad)
    assert np.array_equal(il[~pad], expect[~pad])
    assert np.array_equal(wl, meta.weight_linear[[0, graph.nout - 1]].numpy())
    with pytest.raises(IndexError):
        gv.index_tables_figure(meta, nodes=[meta.nout])


def test_reverse_csr_figure(graph):
    meta = graph.meta(3, 8)
    fig = gv.reverse_csr_figure(meta)
    bars = fig.data[0]
    rows = np.diff(meta.rev_rowptr.numpy())
    assert sum(bars.y) == meta.nin
    assert sum(x * y for x, y in zip(bars.x, bars.y)) == meta.nnz == rows.sum()
    assert f"nnz = {meta.nnz}" in fig.layout.title.text


def test_explore_graph_ok():
    summary, fig = gv.explore_graph(a=1.0, k=25, stride=2, node=3, rf="rf1")
    assert summary["ok"] and isinstance(fig, go.Figure)
    assert (summary["nin"], summary["nout"], summary["k"], summary["v"]) == (4010, 1023, 25, 25)
    assert 0.15 < summary["collision_rate"] < 0.30
    assert "4010 -> 1023 nodes" in summary["message"]
    text = gv.format_summary(summary, ["nin", "pad_fraction"])
    assert text.splitlines()[0] == "nin: 4010" and len(text.splitlines()[1]) <= len("pad_fraction: 0.1234")


def test_explore_graph_clips_k():
    summary, _ = gv.explore_graph(a=0.5, k=9, stride=32, node=0)
    assert summary["ok"] and summary["nout"] == 2 and summary["k"] == 9
    summary, _ = gv.explore_graph(a=0.5, k=400, stride=32, node=1)
    assert summary["ok"] and summary["k"] == 400


@pytest.mark.parametrize("kw, words", [
    (dict(a=0.5, k=0, stride=2), "K must"),
    (dict(a=0.5, k=-4, stride=2), "K must"),
    (dict(a=0.5, k=2.5, stride=2), "K must"),
    (dict(a=0.5, k=10_000, stride=2), "K must"),
    (dict(a=0.0, k=9, stride=2), "a must"),
    (dict(a=float("nan"), k=9, stride=2), "a must"),
    (dict(a=0.5, k=9, stride=0), "stride must"),
    (dict(a=0.5, k=9, stride=2, node=10_000), "node must be < Nout = 964"),
    (dict(a=0.5, k=9, stride=2, node=-1), "node must"),
    (dict(a=0.5, k=9, stride=2, rf="rf9"), "rf must"),
])
def test_explore_graph_invalid_gives_message(kw, words):
    summary, fig = gv.explore_graph(**kw)
    assert summary["ok"] is False and words in summary["message"]
    assert isinstance(fig, go.Figure) and fig.layout.annotations[0].text == summary["message"]


def test_figures_are_deterministic_and_small(graph):
    a = gv.neighbourhood_figure(graph, 5).to_json()
    b = gv.neighbourhood_figure(graph, 5).to_json()
    assert a == b
    assert len(gv.grid_figure(graph).to_json()) < 200_000
    json.loads(a)


def test_graph_figures_read_cleanly(graph):
    """Notebook 01's figures: every axis says what it measures and in which unit (visual positions in FoV radii,
    cortical positions in the cortical map's units, offsets in reference-grid units), no subplot title is clipped at the width a figure
    is laid out for, and the legend covers no tick label or axis title."""
    from fovi_lab.lab import figure_layout as fl
    grid = gv.grid_figure(graph)
    hood = gv.neighbourhood_figure(graph, graph.nout - 1)
    for fig in (grid, hood, gv.explore_graph(a=0.5, k=121, stride=2, node=963, rf="rf1")[1]):
        assert fl.axes_without_units(fig) == []
        assert fl.clipped_titles(fig) == [] and fl.legend_over_ticks(fig) == [] and fl.overlapping_boxes(fig) == []
    assert grid.layout.xaxis.title.text == f"visual x (FoV radii, 1 = {graph.fov / 2:g}°)"
    assert [grid.layout.scene[a].title.text for a in ("xaxis", "yaxis", "zaxis")] == list(gv.CORTICAL_AXIS_TITLES)
    assert hood.layout.xaxis2.title.text == "offset along x (reference-grid units)"
    assert hood.layout.yaxis.title.text == f"visual y (FoV radii, 1 = {graph.fov / 2:g}°)"
    assert hood.layout.legend.yref == "container"
