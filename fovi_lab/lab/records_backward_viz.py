"""Figures of the recorded backward and train step per layer: Warp's adjoints against torch_compact and autograd with
the stage and reduction kernels alone (:func:`backward_recorded_figure`), and every swept gi / gw stage config
(:func:`gi_gw_sweep_figure`).
"""

from __future__ import annotations

from typing import List, Optional

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from fovi_lab.lab.common import COLOURS, batch_menu, drop_empty_traces, message_figure, readable_log_axes, round4
from fovi_lab.lab.labels import kernel_label
from fovi_lab.lab.records_load import backward_records
from fovi_lab.lab.records_select import figure_title, latest_by_config, latest_runs, layer_order


def backward_recorded_figure(records: Optional[List[dict]] = None, mode: str = "backward",
                             height: int = 520) -> go.Figure:
    """Recorded backward (or train-step) ms per layer: Warp's default gi+gw pipeline, torch_compact's
    explicit backward and torch autograd, with Warp's stage / reduction kernels alone; a dropdown
    picks B. Says "no recorded data yet" when there is none."""
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
    fig.update_layout(barmode="group", height=height, margin=dict(l=10, r=10, t=90, b=10),
                      title=figure_title(f"{mode.replace('_', ' ')} (dx and dW) per layer", latest_runs(main)),
                      yaxis_type="log", yaxis_title="ms",
                      updatemenus=batch_menu(all_b, per_b, default_b),
                      legend=dict(orientation="h", y=-0.2))
    return readable_log_axes(drop_empty_traces(fig))


def gi_gw_sweep_figure(records: Optional[List[dict]] = None, batch: Optional[int] = None,
                       height: int = 520) -> go.Figure:
    """Recorded stage-kernel time of every gi / gw config per layer (the ``--sweep`` records), at ``batch``
    (default: the largest recorded); "no recorded data yet" when there is none."""
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
            fig.add_trace(go.Bar(x=layers, y=ys, name=kernel_label(c), hovertemplate="%{x}: %{y:.3f} ms<extra>" + c
                                 + "</extra>"), row=row, col=1)
        fig.update_yaxes(type="log", title_text="ms", row=row, col=1)
    fig.update_layout(barmode="group", height=height, margin=dict(l=10, r=10, t=60, b=10),
                      title=figure_title(f"gi / gw stage configs at B = {b}", latest_runs(sweep)),
                      legend=dict(orientation="h", y=-0.2))
    return readable_log_axes(fig)
