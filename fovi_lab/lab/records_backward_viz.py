"""Figures of the recorded backward and train step per layer: Warp's adjoints against torch_compact and autograd with
the stage and reduction kernels alone (:func:`backward_recorded_figure`), and every swept gi / gw stage config
(:func:`gi_gw_sweep_figure`).
"""

from __future__ import annotations

from typing import List, Optional

import plotly.graph_objects as go
from plotly.subplots import make_subplots

import fovi_lab.lab.figure_layout as figure_layout
from fovi_lab.lab.common import COLOURS, batch_menu, drop_empty_traces, message_figure, readable_log_axes, round4
from fovi_lab.lab.labels import kernel_label, short_label
from fovi_lab.lab.records_load import backward_records
from fovi_lab.lab.records_select import latest_by_config, latest_runs, layer_order, recorded_message


def backward_recorded_figure(records: Optional[List[dict]] = None, mode: str = "backward",
                             height: int = 580) -> go.Figure:
    """Recorded backward (or train-step) ms per layer: Warp's default gi+gw pipeline, torch_compact's
    explicit backward and torch autograd, with Warp's stage / reduction kernels alone; a column of buttons beside
    the plot picks B, the legend stands between the title and the plot. Says "no recorded data yet" when there is
    none."""
    records = backward_records(mode=mode) if records is None else [r for r in records if r.get("mode") == mode]
    warp_impl = "warp" if mode == "backward" else "warp_train"
    main = [r for r in records if r.get("impl") in (warp_impl, "torch_compact") or
            str(r.get("impl", "")).startswith("torch_autograd")]
    main = [r for r in main if r.get("ms") and not r.get("graphed")]
    if not main:
        return message_figure(f"no recorded {mode} data yet (run python -m fovi_lab bench {mode.replace('_', '-')} "
                              f"on a GPU)")
    latest = latest_by_config(main)
    impls = sorted({k[2] for k in latest}, key=lambda s: (s != warp_impl, s != "torch_compact", s))
    all_b = sorted({k[1] for k in latest})
    layers = layer_order(k[0] for k in latest)
    default_b = 512 if 512 in all_b else all_b[-1]
    palette = {warp_impl: COLOURS["warp"], "torch_compact": COLOURS["torch"]}
    fig = go.Figure()
    per_b = len(impls) + 4
    for b in all_b:
        for impl in impls:
            ys = [round4(latest[(l, b, impl, None)]["ms"]) if (l, b, impl, None) in latest else None for l in layers]
            fig.add_trace(go.Bar(x=layers, y=ys, name=impl, marker_color=palette.get(impl), visible=b == default_b))
        for key, name in (("gi_stage_ms", "Warp gi stage kernel"), ("dx_reduce_ms", "Warp dx reduction kernel"),
                          ("gw_stage_ms", "Warp gw stage kernel"), ("dw_reduce_ms", "Warp dW reduction kernel")):
            ys = [round4(latest[(l, b, warp_impl, None)].get(key)) if (l, b, warp_impl, None) in latest else None
                  for l in layers]
            fig.add_trace(go.Scatter(x=layers, y=ys, name=name, mode="markers", visible=b == default_b,
                                     marker=dict(symbol="line-ew-open", size=14)))
    fig.update_layout(barmode="group", margin=dict(l=10, r=10, b=10),
                      yaxis_type="log", yaxis_title="time (ms)", xaxis_title="layer",
                      updatemenus=batch_menu(all_b, per_b, default_b))
    figure_layout.headed(fig, height, f"{mode.replace('_', ' ')} (dx and dW) per layer",
                         recorded_message(latest_runs(main)))
    return readable_log_axes(drop_empty_traces(fig))


def gi_gw_sweep_figure(records: Optional[List[dict]] = None, batch: Optional[int] = None,
                       height: int = 540) -> go.Figure:
    """Recorded stage-kernel time of every gi / gw config per layer (the ``--sweep`` records), at ``batch``
    (default: the largest recorded); "no recorded data yet" when there is none. The legend names each config in short
    words (:func:`~fovi_lab.lab.labels.short_label`) between the title and the plot, the hover text in full words;
    ``height`` is the figure's without the legend, which adds its rows."""
    records = backward_records() if records is None else records
    sweep = [r for r in records if r.get("impl") in ("warp_gi", "warp_gw") and
             (r.get("gi_stage_ms") or r.get("gw_stage_ms"))]
    if not sweep:
        return message_figure("no recorded gi/gw sweep yet (python -m fovi_lab bench backward --sweep on a GPU)")
    bs = sorted({r["B"] for r in sweep})
    b = batch if batch in bs else bs[-1]
    sweep = [r for r in sweep if r["B"] == b and r.get("gw_finish", "csr") in (None, "csr")]
    latest = latest_by_config(sweep)
    layers = layer_order(k[0] for k in latest)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("grad-input stage kernel (ms)", "grad-weight stage kernel (ms)"))
    for row, impl, key in ((1, "warp_gi", "gi_stage_ms"), (2, "warp_gw", "gw_stage_ms")):
        cfgs = sorted({k[3] for k in latest if k[2] == impl and k[3]})
        for c in cfgs:
            ys = [round4(latest[(l, b, impl, c)].get(key)) if (l, b, impl, c) in latest else None for l in layers]
            fig.add_trace(go.Bar(x=layers, y=ys, name=short_label(c), customdata=[kernel_label(c)] * len(layers),
                                 hovertemplate="%{x}: %{y:.3f} ms, %{customdata}<extra>" + c + "</extra>"),
                          row=row, col=1)
        fig.update_yaxes(type="log", title_text="stage kernel (ms)", row=row, col=1)
    fig.update_xaxes(title_text="layer", row=2, col=1)
    fig.update_layout(barmode="group", margin=dict(l=10, r=10, b=10))
    height += figure_layout.legend_px(fig)
    figure_layout.headed(fig, height, f"gi / gw stage configs at B = {b}", recorded_message(latest_runs(sweep)))
    return readable_log_axes(fig)
