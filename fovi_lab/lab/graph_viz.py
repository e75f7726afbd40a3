"""Pictures of a foveated KNN graph, and the callback of notebook 01's widget.

Every function is ``parameters -> data -> plotly go.Figure`` (never a ``FigureWidget``: a plain
figure is small JSON, renders without a kernel and can be tested headless). Coordinates are
rounded to 4 decimals and stored as float32 so figures are compact and identical from run to run.

* :func:`grid_figure` -- the input/output grids in visual space and on the cortical manifold.
* :func:`neighbourhood_figure` -- one output node's K neighbours coloured by kernel tap, next to
  their normalised offsets on the reference grid.
* :func:`index_tables_figure` -- ``input_linear`` / ``weight_linear`` rows of a few nodes.
* :func:`reverse_csr_figure` -- the reverse CSR's row lengths (how many (k, n) read each input).
* :func:`explore_graph` -- ``(a, k, stride, node, rf) -> (summary dict, figure)`` for the widget;
  an invalid choice returns a message in the summary and a figure that says so, never raises.
* :func:`format_summary` -- a deterministic one-line-per-field text of a summary dict.
"""

from __future__ import annotations

import math
from typing import Iterable, Optional, Sequence, Tuple

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from fovi_lab.graph.geometry import KNNGraph, foveated_knn_graph
from fovi_lab.graph.meta import TrainingMeta
import fovi_lab.lab.figure_layout as figure_layout

__all__ = [
    "grid_figure", "neighbourhood_figure", "index_tables_figure", "reverse_csr_figure",
    "explore_graph", "format_summary", "EXPLORE_LIMITS", "visual_axis_titles", "CORTICAL_AXIS_TITLES",
    "OFFSET_AXIS_TITLES",
]

#: Bounds :func:`explore_graph` accepts (keeps the widget responsive on a laptop CPU).
EXPLORE_LIMITS = {"a": (0.05, 100.0), "k": (1, 400), "stride": (1, 32)}

_PAD_COLOUR = "#d62728"
_FAINT = "#c7c7c7"


def _f(x) -> np.ndarray:
    """Round to 4 decimals, float32: small, stable JSON."""
    return np.round(np.asarray(x, dtype=np.float64), 4).astype(np.float32)


def _square_axes(fig: go.Figure) -> None:
    """Equal x/y scale on the first 2-D subplot."""
    fig.update_xaxes(scaleanchor="y", scaleratio=1, row=1, col=1)


def visual_axis_titles(graph: KNNGraph) -> Tuple[str, str]:
    """The titles of the visual-space axes: positions in the visual field in units of the field of view's radius
    (the graph's normalised coordinates: 1 is the FoV edge, ``fov/2`` degrees from the centre of gaze)."""
    unit = f"FoV radii, 1 = {graph.fov / 2:g}°"
    return f"visual x ({unit})", f"visual y ({unit})"


#: The titles of the cortical axes: :func:`fovi_lab.graph.grid.cortical_coords` in its own units, the magnification
#: ``M(t) = 10/(t + a)`` integrated over eccentricity in degrees (docs/operator.md §6.2), which the package ties to no
#: length on the cortex.
CORTICAL_AXIS_TITLES = ("cortical x (cortical units)", "cortical y (cortical units)",
                        "cortical height z (cortical units)")

#: The titles of the offset axes: the per-node normalised offsets, in units of the reference grid's half side.
OFFSET_AXIS_TITLES = ("offset along x (reference-grid units)", "offset along y (reference-grid units)")


# --------------------------------------------------------------------------------------------
# grids
# --------------------------------------------------------------------------------------------

def grid_figure(graph: KNNGraph, show_pad: bool = True, height: int = 520) -> go.Figure:
    """The graph's nodes in visual space (left) and on the cortical sensor manifold (right).

    Left: input nodes (small grey), output nodes (blue), padding band (red
    crosses) in normalised visual coordinates; the unit circle is the FoV edge. Right: the input
    nodes' 3-D cortical coordinates ``(rho cos theta, rho sin theta, z)``, where equal steps are
    equal cortical distances: the dense fovea is spread out, the sparse periphery pulled in.

    Args:
        graph: a :class:`~fovi_lab.graph.geometry.KNNGraph`.
        show_pad: draw the padding candidates too.

    Returns:
        A ``go.Figure`` with one 2-D and one 3-D subplot.
    """
    fig = make_subplots(rows=1, cols=2, specs=[[{"type": "xy"}, {"type": "scene"}]],
                        subplot_titles=(f"visual space: {graph.nin} inputs, {graph.nout} outputs",
                                        "the inputs on the cortical manifold"))
    xin, xout = graph.in_coords, graph.out_coords
    fig.add_trace(go.Scattergl(x=_f(xin[:, 0]), y=_f(xin[:, 1]), mode="markers", name="input nodes",
                               marker=dict(size=2, color="#7f7f7f")), row=1, col=1)
    if not graph.same_grid:
        fig.add_trace(go.Scattergl(x=_f(xout[:, 0]), y=_f(xout[:, 1]), mode="markers", name="output nodes",
                                   marker=dict(size=5, color="#1f77b4")), row=1, col=1)
    if show_pad and len(graph.pad_coords):
        pad = graph.pad_coords
        fig.add_trace(go.Scattergl(x=_f(pad[:, 0]), y=_f(pad[:, 1]), mode="markers", name="padding band",
                                   marker=dict(size=3, symbol="x", color=_PAD_COLOUR)), row=1, col=1)
    phi = np.linspace(0, 2 * np.pi, 121)
    fig.add_trace(go.Scatter(x=_f(np.cos(phi)), y=_f(np.sin(phi)), mode="lines", name="FoV edge",
                             line=dict(color="black", width=1)), row=1, col=1)
    c = graph.in_cortical
    fig.add_trace(go.Scatter3d(x=_f(c[:, 0]), y=_f(c[:, 1]), z=_f(c[:, 2]), mode="markers",
                               name="inputs (cortex)", showlegend=False,
                               marker=dict(size=1.5, color="#7f7f7f")), row=1, col=2)
    _square_axes(fig)
    vx, vy = visual_axis_titles(graph)
    fig.update_xaxes(title_text=vx, row=1, col=1)
    fig.update_yaxes(title_text=vy, row=1, col=1)
    cx, cy, cz = CORTICAL_AXIS_TITLES
    fig.update_layout(margin=dict(l=10, r=10),
                      scene=dict(aspectmode="data", xaxis_title=cx, yaxis_title=cy, zaxis_title=cz))
    _fit(fig, height)
    return fig


def _fit(fig: go.Figure, height: int) -> None:
    """Subplot titles wrapped to their room, the top margin grown to hold them, the legend under the x axis title."""
    figure_layout.fit_top(fig)
    figure_layout.legend_below(fig, height)


# --------------------------------------------------------------------------------------------
# one node's neighbourhood and its taps
# --------------------------------------------------------------------------------------------

def neighbourhood_figure(graph: KNNGraph, node: int, height: int = 520) -> go.Figure:
    """Output node ``node``'s K neighbours, coloured by tap, and the reference grid.

    Left, visual space: the node (black star), nearby input nodes (faint), the output grid of the layer's stride
    (open diamonds), its neighbours coloured by ``rf_index`` (pad neighbours as red crosses, placed at their
    padding-band position). The view holds the neighbourhood and the nearest other output node, so a stride
    wider than the neighbourhood widens it: the inputs between the neighbourhoods are read by no output.
    Right, the normalised offsets ``u[node]`` in ``[-1, 1]²`` with the ``s x s`` reference grid
    (open squares); each neighbour is joined to the tap it falls into, and a neighbour whose tap an
    earlier neighbour already took (a collision) gets a black ring.

    Args:
        graph: a :class:`~fovi_lab.graph.geometry.KNNGraph`. node: output node id in ``[0, Nout)``.

    Returns:
        A ``go.Figure`` with two 2-D subplots.

    Raises:
        IndexError: ``node`` out of range.
    """
    node = int(node)
    if not 0 <= node < graph.nout:
        raise IndexError(f"node: expected 0 <= node < {graph.nout}, got {node}")
    cand_xy = np.concatenate([graph.in_coords, graph.pad_coords], axis=0)
    ids = graph.cand_idx[node]
    pts = cand_xy[ids]
    rf = graph.rf_index[node].numpy()
    pad = ids >= graph.nin
    hit = graph.collided[node]
    centre = graph.out_coords[node]
    u = graph.local_offsets[node]
    ref = graph.ref_points
    colour = dict(colorscale="Turbo", cmin=0, cmax=max(1, graph.v - 1))

    stride = f"{graph.out_stride / graph.in_stride:g}"
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12, subplot_titles=(
        f"node {node}: {graph.k} neighbours ({int(pad.sum())} pad), stride {stride}",
        f"offsets on the {graph.ref_side} x {graph.ref_side} reference grid<br>"
        f"{len(np.unique(rf))} taps used, {int(hit.sum())} collisions"))

    # context: inputs and the output grid of this stride within a box around the neighbourhood, wide enough to
    # hold the nearest other output node (a stride larger than the neighbourhood widens the view)
    span = max(float(np.abs(pts - centre).max()), 1.2 * output_spacing(graph, node), 1e-3) * 1.3
    near = np.all(np.abs(graph.in_coords - centre) <= span, axis=1)
    ctx = graph.in_coords[near]
    fig.add_trace(go.Scatter(x=_f(ctx[:, 0]), y=_f(ctx[:, 1]), mode="markers", name="other inputs",
                             marker=dict(size=4, color=_FAINT), hoverinfo="skip"), row=1, col=1)
    outs = graph.out_coords[np.all(np.abs(graph.out_coords - centre) <= span, axis=1)]
    fig.add_trace(go.Scatter(x=_f(outs[:, 0]), y=_f(outs[:, 1]), mode="markers", name=f"output nodes, stride {stride}",
                             marker=dict(size=11, symbol="diamond-open", color="black", line=dict(width=1.5)),
                             hoverinfo="skip"), row=1, col=1)
    real = ~pad
    text = [f"k={k} tap={int(rf[k])}" + (" (pad)" if pad[k] else "") for k in range(graph.k)]
    fig.add_trace(go.Scatter(x=_f(pts[real, 0]), y=_f(pts[real, 1]), mode="markers", name="neighbours",
                             text=[t for t, r in zip(text, real) if r], hoverinfo="text",
                             marker=dict(size=8, color=rf[real].tolist(), showscale=True,
                                         colorbar=dict(title="tap", x=0.44, len=0.9), **colour)),
                  row=1, col=1)
    if pad.any():
        fig.add_trace(go.Scatter(x=_f(pts[pad, 0]), y=_f(pts[pad, 1]), mode="markers", name="pad neighbours",
                                 text=[t for t, p in zip(text, pad) if p], hoverinfo="text",
                                 marker=dict(size=9, symbol="x", color=_PAD_COLOUR)), row=1, col=1)
    fig.add_trace(go.Scatter(x=_f([centre[0]]), y=_f([centre[1]]), mode="markers", name="output node",
                             marker=dict(size=14, symbol="star", color="black")), row=1, col=1)

    # right: offsets and taps
    fig.add_trace(go.Scatter(x=_f(ref[:, 0]), y=_f(ref[:, 1]), mode="markers", name="taps (reference grid)",
                             text=[f"tap {v}" for v in range(graph.v)], hoverinfo="text",
                             marker=dict(size=9, symbol="square-open", color="#7f7f7f")), row=1, col=2)
    seg_x, seg_y = [], []
    for k in range(graph.k):
        seg_x += [float(u[k, 0]), float(ref[rf[k], 0]), None]
        seg_y += [float(u[k, 1]), float(ref[rf[k], 1]), None]
    fig.add_trace(go.Scatter(x=[None if v is None else round(v, 4) for v in seg_x],
                             y=[None if v is None else round(v, 4) for v in seg_y], mode="lines",
                             name="neighbour -> tap", line=dict(color="#bbbbbb", width=1), hoverinfo="skip"),
                  row=1, col=2)
    fig.add_trace(go.Scatter(x=_f(u[:, 0]), y=_f(u[:, 1]), mode="markers", name="offsets u",
                             text=text, hoverinfo="text", showlegend=False,
                             marker=dict(size=8, color=rf.tolist(),
                                         symbol=["x" if p else "circle" for p in pad],
                                         line=dict(width=[2 if h else 0 for h in hit], color="black"),
                                         **colour)), row=1, col=2)
    _square_axes(fig)
    fig.update_xaxes(range=[-1.15, 1.15], row=1, col=2)
    fig.update_yaxes(range=[-1.15, 1.15], scaleanchor="x2", scaleratio=1, row=1, col=2)
    vx, vy = visual_axis_titles(graph)
    fig.update_xaxes(title_text=vx, row=1, col=1)
    fig.update_yaxes(title_text=vy, row=1, col=1)
    fig.update_xaxes(title_text=OFFSET_AXIS_TITLES[0], row=1, col=2)
    fig.update_yaxes(title_text=OFFSET_AXIS_TITLES[1], row=1, col=2)
    fig.update_layout(margin=dict(l=10, r=10))
    _fit(fig, height)
    return fig


def output_spacing(graph: KNNGraph, node: int) -> float:
    """The visual-space distance from output node ``node`` to the nearest other output node (the output grid's
    local spacing, which the stride sets; 0 for a layer of one output node)."""
    d = np.linalg.norm(graph.out_coords - graph.out_coords[int(node)], axis=1)
    d = d[d > 0]
    return float(d.min()) if d.size else 0.0


def unread_fraction(graph: KNNGraph) -> float:
    """The share of input nodes that no output node reads (a stride wider than the neighbourhoods skips inputs)."""
    idx = graph.idx.numpy()
    return 1.0 - len(np.unique(idx[idx < graph.nin])) / graph.nin


# --------------------------------------------------------------------------------------------
# index tables and the reverse CSR
# --------------------------------------------------------------------------------------------

def index_tables_figure(meta: TrainingMeta, nodes: Sequence[int] = (0, 1, 2, 3),
                        height: Optional[int] = None) -> go.Figure:
    """Heat maps of ``input_linear`` and ``weight_linear`` rows for a few output nodes.

    Columns are ``p = c*K + k`` (channel-major: each channel is a block of K columns, dashed lines),
    then the ``P..P64`` filler. Input-pad entries (``== Cin*Nin``: a pad neighbour or a filler) are
    shown as gaps in the top map; in the bottom map they point at a real weight row (tap of the pad
    neighbour, or row 0 for fillers), harmless because the paired input is zero.

    Args:
        meta: a :class:`~fovi_lab.graph.meta.TrainingMeta`. nodes: output node ids to show.

    Returns:
        A ``go.Figure`` with two stacked heat maps sharing the p axis.
    """
    nodes = [int(n) for n in nodes]
    if not nodes or min(nodes) < 0 or max(nodes) >= meta.nout:
        raise IndexError(f"nodes: expected ids in [0, {meta.nout}), got {nodes}")
    il = meta.input_linear[nodes].cpu().numpy().astype(np.int64)
    wl = meta.weight_linear[nodes].cpu().numpy().astype(np.int64)
    pad = il == meta.pad_column
    il_show = np.where(pad, np.nan, il).astype(np.float64)
    ylab = [f"n={n}" for n in nodes]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.14, subplot_titles=(
        f"input_linear = c*Nin + idx  (gaps: pad column Cin*Nin = {meta.pad_column})",
        f"weight_linear = c*V + rf  (V = {meta.v}; fillers p >= P = {meta.p} point at row 0)"))
    fig.add_trace(go.Heatmap(z=il_show.tolist(), y=ylab, colorscale="Viridis", name="input_linear",
                             colorbar=dict(y=0.79, len=0.42, title="flat x col")), row=1, col=1)
    fig.add_trace(go.Heatmap(z=wl.tolist(), y=ylab, colorscale="Cividis", name="weight_linear",
                             colorbar=dict(y=0.21, len=0.42, title="W col")), row=2, col=1)
    for row in (1, 2):
        for c in range(1, meta.cin):
            fig.add_vline(x=c * meta.k - 0.5, line=dict(color="white", width=1, dash="dot"), row=row, col=1)
        if meta.p64 > meta.p:
            fig.add_vline(x=meta.p - 0.5, line=dict(color=_PAD_COLOUR, width=2), row=row, col=1)
    fig.update_xaxes(title_text=f"p = c*K + k   (P = {meta.p}, P64 = {meta.p64})", row=2, col=1)
    fig.update_yaxes(title_text="output node")
    fig.update_layout(height=height or 240 + 40 * len(nodes), margin=dict(l=10, r=10, b=10))
    figure_layout.fit_top(fig)
    return fig


def reverse_csr_figure(meta: TrainingMeta, height: int = 340) -> go.Figure:
    """Histogram of the reverse CSR's row lengths ``rev_rowptr[m+1] - rev_rowptr[m]``.

    Row ``m`` lists every non-pad (k, n) that reads input node ``m``; its length is the node's
    fan-out (reuse). The mean is ``nnz / Nin`` (~27 for the AlexNet stem): this is the reuse a
    gather-based grad-input reduction exploits, and the spread is its load imbalance.
    """
    rows = np.diff(meta.rev_rowptr.cpu().numpy().astype(np.int64))
    mean = float(rows.mean()) if rows.size else 0.0
    values, counts = np.unique(rows, return_counts=True)
    fig = go.Figure(go.Bar(x=values.tolist(), y=counts.tolist(), name="input nodes",
                           marker_color="#1f77b4"))
    fig.add_vline(x=mean, line=dict(color=_PAD_COLOUR, dash="dash"),
                  annotation_text=f"mean {mean:.1f}", annotation_position="top")
    fig.update_layout(title=f"reverse CSR: {meta.nin} rows, nnz = {meta.nnz}, "
                            f"row length {int(rows.min()) if rows.size else 0}..{int(rows.max()) if rows.size else 0}",
                      xaxis_title="references to the input node (row length)", yaxis_title="input nodes (count)",
                      height=height, margin=dict(l=10, r=10, t=50, b=10), bargap=0.05)
    return fig


# --------------------------------------------------------------------------------------------
# the widget's callback
# --------------------------------------------------------------------------------------------

def _message_figure(message: str) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=message, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                       font=dict(size=14, color=_PAD_COLOUR))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    fig.update_layout(height=200, margin=dict(l=10, r=10, t=10, b=10))
    return fig


def _check(a, k, stride, node, rf) -> Optional[str]:
    lo, hi = EXPLORE_LIMITS["a"]
    try:
        a = float(a)
    except (TypeError, ValueError):
        return f"a must be a number, got {a!r}"
    if not (math.isfinite(a) and lo <= a <= hi):
        return f"a must lie in [{lo}, {hi}] (smaller a = stronger foveation), got {a}"
    lo, hi = EXPLORE_LIMITS["k"]
    if isinstance(k, bool) or not isinstance(k, (int, np.integer, float)) or int(k) != k or not lo <= k <= hi:
        return f"K must be an integer in [{lo}, {hi}], got {k!r}"
    lo, hi = EXPLORE_LIMITS["stride"]
    if isinstance(stride, bool) or not isinstance(stride, (int, np.integer, float)) or not lo <= stride <= hi:
        return f"stride must lie in [{lo}, {hi}], got {stride!r}"
    if rf not in ("rf1", "rf2"):
        return f"rf must be 'rf1' or 'rf2', got {rf!r}"
    if isinstance(node, bool) or not isinstance(node, (int, np.integer)) or node < 0:
        return f"node must be a non-negative integer, got {node!r}"
    return None


def explore_graph(a: float, k: int, stride: float, node: int = 0, rf: str = "rf2",
                  fov: float = 16.0, res: int = 64) -> Tuple[dict, go.Figure]:
    """Build the stride-``stride`` KNN layer over the 64x64-matched grid and draw one node.

    The layer reads the input grid matched to ``res²`` points and writes the output grid matched
    to ``(res/stride)²`` points (stride 1: the same grid), with ``K`` cortical nearest neighbours
    and an ``rf1``/``rf2`` reference frame.

    Args:
        a: magnification parameter (smaller = stronger foveation). k: neighbours K.
        stride: output stride. node: output node to draw. rf: ``"rf1"`` or ``"rf2"``.

    Returns:
        ``(summary, figure)``. ``summary`` always has ``ok`` and ``message``; when ``ok`` it also
        has nin, nout, k (clipped to Nin), ref_side, v, pad_fraction, collision_rate,
        empty_tap_rate, p_per_channel (= K), the node's pads / distinct taps, ``node_spacing`` (the distance to
        the nearest other output node, :func:`output_spacing`) and ``unread_inputs`` (:func:`unread_fraction`). Invalid
        parameters give ``ok=False``, a message saying why, and a figure showing the message.
    """
    summary = {"ok": False, "a": a, "k_requested": k, "stride": stride, "node": node, "rf": rf}
    problem = _check(a, k, stride, node, rf)
    if problem is None:
        graph = foveated_knn_graph(fov=fov, a=float(a), res=res, in_stride=1, out_stride=float(stride),
                                   k=int(k), ref_frame_mult=2.0 if rf == "rf2" else 1.0)
        if node >= graph.nout:
            problem = f"node must be < Nout = {graph.nout} for stride {stride}, got {node}"
    if problem is not None:
        summary["message"] = problem
        return summary, _message_figure(problem)

    rf_row = graph.rf_index[node].numpy()
    summary.update(
        ok=True,
        nin=graph.nin, nout=graph.nout, k=graph.k, ref_side=graph.ref_side, v=graph.v,
        pad_fraction=graph.pad_fraction, collision_rate=graph.collision_rate,
        empty_tap_rate=graph.empty_tap_rate,
        node_pads=int((graph.idx[node] == graph.nin).sum()), node_distinct_taps=int(len(np.unique(rf_row))),
        node_spacing=output_spacing(graph, node), unread_inputs=unread_fraction(graph),
        message=(f"{graph.nin} -> {graph.nout} nodes, K = {graph.k}"
                 + (f" (clipped from {int(k)})" if graph.k != int(k) else "")
                 + f", V = {graph.v}: {100 * graph.pad_fraction:.1f} % pad entries, "
                   f"{100 * graph.collision_rate:.1f} % tap collisions; "
                   f"{100 * unread_fraction(graph):.0f} % of the inputs read by no output node"),
    )
    return summary, neighbourhood_figure(graph, node)


def format_summary(summary: dict, keys: Optional[Iterable[str]] = None, digits: int = 4) -> str:
    """``key: value`` lines with floats rounded to ``digits`` (stable text for notebook output)."""
    keys = list(summary) if keys is None else list(keys)
    lines = []
    for key in keys:
        val = summary[key]
        if isinstance(val, float):
            val = round(val, digits)
        lines.append(f"{key}: {val}")
    return "\n".join(lines)
