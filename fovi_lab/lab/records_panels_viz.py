"""Bars of recorded whole ops replayed from CUDA graphs, over the batch ``B``: one layer's replays
(:func:`layer_replays_figure`), one panel per batch (:func:`batch_panels_figure`), and the learner's own batch marked
on such a figure (:func:`mark_batch`).
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import plotly.graph_objects as go

import fovi_lab.lab.figure_layout as figure_layout
from fovi_lab.lab.common import message_figure, readable_log_axes
from fovi_lab.lab.records_select import recorded_message


def layer_replays_figure(layer: str, rows: List[dict], series, runs: str, empty: str, log: bool = False,
                         height: int = 380) -> go.Figure:
    """Grouped bars of one layer's recorded replays over B (the widgets' side figures of notebooks 02 and 10).

    ``rows``: one dict per batch with a ``B`` and ``records``; ``series``: ``(ms key, config key, name, colour)``
    per bar group; ``runs``: the runs named in the subtitle; ``empty``: the message when there are no rows. The
    legend stands under the batch axis (its short labels do not turn), which leaves the top of the plot to the
    note :func:`mark_batch` writes there."""
    if not rows:
        return message_figure(empty)
    fig = go.Figure()
    for key, cfg_key, name, colour in series:
        fig.add_trace(go.Bar(x=[f"B={r['B']}" for r in rows], y=[r[key] for r in rows], name=name,
                             marker_color=colour, customdata=[r.get(cfg_key) for r in rows],
                             hovertemplate="%{x}: %{y:.3f} ms (%{customdata})<extra>" + name + "</extra>"))
    recs = [rec for r in rows for rec in r["records"]]
    fig.update_layout(barmode="group", yaxis=dict(type="log" if log else "linear", title="time per op (ms)"),
                      xaxis_title="batch")
    figure_layout.headed(fig, height, f"{layer}: recorded replays",
                         recorded_message(recs, f"{runs}, medians"),
                         legend="below")
    return readable_log_axes(fig)


def mark_batch(fig: go.Figure, batch, note: Optional[str] = None) -> go.Figure:
    """Mark ``batch`` on a figure of bars over ``B=...`` categories (the widgets of notebooks 11 and 13): a dashed line
    named ``your batch: B = ...`` (the categories kept in batch order) and ``note`` (the live run) as an annotation
    over the plot's top left, wrapped to the figure's width, the top margin grown by its lines."""
    ys = [v for t in fig.data if t.type == "bar" for v in (t.y or ()) if v]
    if not ys or isinstance(batch, bool) or not isinstance(batch, int):
        return fig
    cat = f"B={batch}"
    cats = sorted({x for t in fig.data for x in (t.x or ())} | {cat}, key=lambda c: int(str(c)[2:]))
    low = min(ys) if fig.layout.yaxis.type == "log" else 0
    fig.add_trace(go.Scatter(x=[cat, cat], y=[low, max(ys)], mode="lines", name=f"your batch: B = {batch}",
                             line=dict(color="black", dash="dash"), hoverinfo="skip"))
    fig.update_xaxes(categoryorder="array", categoryarray=cats)
    if note:
        lines = figure_layout.wrap_words(note, int(figure_layout.FIGURE_WIDTH * 0.9 / (figure_layout.CHAR_EM * 11)))
        fig.add_annotation(text="<br>".join(lines), xref="paper", yref="paper", x=0, y=1.0, xanchor="left",
                           yanchor="bottom", align="left", showarrow=False, font=dict(size=11))
        grow = int(len(lines) * 1.3 * 11) + 4
        fig.update_layout(height=(fig.layout.height or 450) + grow, margin=dict(t=(fig.layout.margin.t or 100) + grow))
    return fig


def batch_panels_figure(rows: List[dict], series: Sequence[Tuple[str, str, str, str]], title: str, subtitle: str,
                        height: int = 520, outline_pick: bool = False):
    """Recorded whole ops replayed from CUDA graphs, one panel per batch ``B``: per layer, a bar per series
    ``(ms key, config key, name, colour)`` of ``rows`` (dicts with ``layer``, ``B``, ``records`` and those keys),
    on a log axis, the config in the hover. ``outline_pick``: outline the bar whose config is the row's
    ``pick``. Under the title ``title``, the records' device and versions and ``subtitle``; the legend stands
    between the title and the plot, clear of the turned layer names."""
    from plotly.subplots import make_subplots
    batches = sorted({r["B"] for r in rows})
    fig = make_subplots(rows=1, cols=len(batches), subplot_titles=[f"B = {b}" for b in batches], shared_yaxes=True)
    for col, b in enumerate(batches, start=1):
        rs = [r for r in rows if r["B"] == b]
        xs = [r["layer"] for r in rs]
        for key, cfg_key, name, colour in series:
            bar = dict(x=xs, y=[r[key] for r in rs], name=name, marker_color=colour, legendgroup=name,
                       showlegend=col == 1, customdata=[r.get(cfg_key) for r in rs],
                       hovertemplate="%{x}: %{y:.3f} ms (%{customdata})<extra>" + name + "</extra>")
            if outline_pick:
                bar["marker_line"] = dict(width=[2.5 if r["pick"] == r.get(cfg_key) else 0 for r in rs], color="black")
            fig.add_trace(go.Bar(**bar), row=1, col=col)
        fig.update_xaxes(tickangle=-45, title_text="layer", row=1, col=col)
    fig.update_yaxes(type="log", title_text="time per op (ms)", row=1, col=1)
    recs = [rec for r in rows for rec in r["records"]]
    fig.update_layout(barmode="group", margin=dict(b=10))
    figure_layout.headed(fig, height, title, recorded_message(recs, subtitle))
    return readable_log_axes(fig)
