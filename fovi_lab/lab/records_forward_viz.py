"""Figures of the recorded forward per layer: time and throughput against PyTorch and the dense ceiling
(:func:`forward_recorded_figure`), a roofline (:func:`roofline_figure`), weight reuse over its r = 1 twins
(:func:`reuse_recorded_figure`) and the heuristic's pick against the fastest swept config (:func:`heuristic_figure`).
"""

from __future__ import annotations

import math
from typing import List, Optional, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

import fovi_lab.lab.figure_layout as figure_layout
from fovi_lab.lab.common import (COLOURS, batch_menu, drop_empty_traces, hline, log_range, message_figure,
                                 readable_log_axes, round4)
from fovi_lab.lab.labels import kernel_label, short_label
from fovi_lab.lab.records_load import forward_records
from fovi_lab.lab.records_select import layer_order, recorded_message, sweep_records
from fovi_lab.lab.records_tables import (REUSE_PAIRS, forward_rows, gemm_ceilings, heuristic_table, pair_kernel_ms,
                                         tflops_of)


def forward_recorded_figure(records: Optional[List[dict]] = None, batches: Optional[Sequence[int]] = None,
                            height: int = 760) -> go.Figure:
    """The recorded forward: per layer, ms (top, log) and TFLOP/s (bottom, log) of the Warp kernel with
    the heuristic's config (whole op, and kernel alone), the dense tile-GEMM ceiling of the same tiles
    (kernel alone), the strongest PyTorch baseline and the Warp cached kernel (whole ops). A column of buttons
    beside the plot picks B; the title carries device, Warp and torch versions; the legend stands between the title
    and the plot, clear of the rotated layer names; dashed lines: Warp's dense 4096³ GEMM and cuBLAS."""
    records = forward_records() if records is None else records
    rows, used = forward_rows(records)
    if not rows:
        return message_figure("no recorded forward data yet (run python -m fovi_lab bench forward on a GPU)")
    all_b = sorted({r["B"] for r in rows})
    batches = [b for b in (batches or all_b) if b in all_b] or all_b
    series = (("pick_ms", "Warp, heuristic's config (whole op)", COLOURS["warp"]),
              ("pick_kernel_ms", "Warp, same config (kernel alone)", COLOURS["warp_best"]),
              ("pick_dense_ms", "Warp dense tile-GEMM ceiling, same tiles (kernel alone)", COLOURS["dense"]),
              ("torch_ms", "strongest PyTorch (whole op)", COLOURS["torch"]),
              ("cached_ms", "Warp cached Weff (whole op)", COLOURS["cached"]))
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.07,
                        subplot_titles=("time per call (ms, lower is better)",
                                        "TFLOP/s (2·B·P64·Cout·Nout / time)"))
    default_b = 512 if 512 in batches else batches[-1]
    for b in batches:
        sel = [r for r in rows if r["B"] == b]
        x = [r["layer"] for r in sel]
        for key, name, colour in series:
            text = [(r.get("torch_impl") if key == "torch_ms" else
                     r.get("cached_config") if key == "cached_ms" else r.get("pick_config")) or "" for r in sel]
            for row, val in ((1, [round4(r[key]) for r in sel]),
                             (2, [round4(tflops_of(r["flops"], r[key])) for r in sel])):
                fig.add_trace(go.Bar(x=x, y=val, name=name, marker_color=colour, legendgroup=name,
                                     showlegend=row == 1, visible=b == default_b, hovertext=text),
                              row=row, col=1)
    g = gemm_ceilings(records)
    layers_x = layer_order(r["layer"] for r in rows)
    n_lines = 0
    if "warp_tflops" in g:
        fig.add_trace(hline(layers_x, g["warp_tflops"], f"Warp dense tile GEMM 4096³ ({g['warp_tflops']:.0f} TFLOP/s)",
                             COLOURS["dense"]), row=2, col=1)
        n_lines += 1
    if "cublas_tflops" in g:
        fig.add_trace(hline(layers_x, g["cublas_tflops"], f"cuBLAS 4096³ ({g['cublas_tflops']:.0f} TFLOP/s)",
                             COLOURS["torch"]), row=2, col=1)
        n_lines += 1
    ms_vals = [r[k] for r in rows for k, _, _ in series if r.get(k)]
    tf_vals = [tflops_of(r["flops"], r[k]) for r in rows for k, _, _ in series if r.get(k)]
    tf_vals += [v for k, v in g.items() if k.endswith("tflops")]
    fig.update_yaxes(type="log", row=1, col=1, title_text="time (ms)", range=log_range(ms_vals))
    fig.update_yaxes(type="log", row=2, col=1, title_text="throughput (TFLOP/s)", range=log_range(tf_vals))
    fig.update_xaxes(title_text="layer", row=2, col=1)
    fig.update_layout(barmode="group", margin=dict(l=10, r=10, b=10),
                      updatemenus=batch_menu(batches, 2 * len(series), default_b, always=n_lines))
    figure_layout.headed(fig, height, "Compact forward: time and throughput per layer", recorded_message(used))
    return readable_log_axes(drop_empty_traces(fig))


def roofline_figure(records: Optional[List[dict]] = None, batch: int = 512, hbm_tbps: float = 4.8,
                    peak_tflops: float = 990.0, height: int = 540) -> go.Figure:
    """Roofline of the recorded forward at ``batch``: x = FLOPs per byte of the fewest bytes the op must
    move, y = TFLOP/s. The H200 roof (4.8 TB/s HBM, 990 TFLOP/s dense fp16, datasheet), Warp's dense
    4096³ tile GEMM and cuBLAS as horizontal ceilings; points: the Warp kernel with the heuristic's config,
    the dense ceiling of its tiles, the strongest PyTorch op."""
    records = forward_records() if records is None else records
    all_rows, used = forward_rows(records)
    rows = [r for r in all_rows if r["B"] == batch and r.get("flops") and r.get("bytes")]
    if not rows:
        return message_figure(f"no recorded forward data at B = {batch} yet")
    ai = [r["flops"] / r["bytes"] for r in rows]
    xs = np.logspace(math.log10(min(ai) / 4), math.log10(max(ai) * 4), 60)
    roof = [min(peak_tflops, hbm_tbps * x) for x in xs]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[round4(v) for v in xs], y=[round4(v) for v in roof], mode="lines",
                             name="H200 roofline (datasheet)", line=dict(color="black")))
    g = gemm_ceilings(records)
    xr = [round4(xs[0]), round4(xs[-1])]
    if "cublas_tflops" in g:
        fig.add_trace(hline(xr, g["cublas_tflops"], f"cuBLAS 4096³ ({g['cublas_tflops']:.0f})", COLOURS["torch"]))
    if "warp_tflops" in g:
        fig.add_trace(hline(xr, g["warp_tflops"], f"Warp tile GEMM 4096³ ({g['warp_tflops']:.0f})", COLOURS["dense"]))
    for key, name, colour, sym in (
            ("pick_kernel_ms", "Warp, heuristic's config (kernel)", COLOURS["warp_best"], "circle"),
            ("pick_dense_ms", "Warp dense ceiling, same tiles", COLOURS["dense"], "diamond"),
            ("torch_ms", "strongest PyTorch (op)", COLOURS["torch"], "square")):
        fig.add_trace(go.Scatter(x=[round4(a) for a in ai], y=[round4(tflops_of(r["flops"], r[key])) for r in rows],
                                 mode="markers+text",
                                 text=[r["layer"] if key == "pick_kernel_ms" else "" for r in rows],
                                 textposition="top center", textfont=dict(size=9), name=name,
                                 marker=dict(color=colour, size=9, symbol=sym)))
    ys = [y for t in fig.data for y in t.y if y is not None]
    fig.update_xaxes(type="log", title_text="arithmetic intensity (FLOP per byte the op must move)")
    fig.update_yaxes(type="log", title_text="throughput (TFLOP/s)", range=log_range(ys + [peak_tflops], pad=1.3))
    fig.update_layout(margin=dict(l=10, r=10, b=10))
    figure_layout.headed(fig, height, f"Roofline of the compact forward at B = {batch}",
                         recorded_message([r for r in used if r.get("B") == batch]))
    return readable_log_axes(fig)


def reuse_recorded_figure(records: Optional[List[dict]] = None, pairs=REUSE_PAIRS, height: int = 560) -> go.Figure:
    """Recorded kernel time of each r=2 / r=4 config over its r=1 twin (same tiles and threads), per
    layer; below 1 means weight reuse paid. A column of buttons beside the plot picks B; the legend stands between
    the title and the plot."""
    records = forward_records() if records is None else records
    ms, sweep = pair_kernel_ms(records, pairs)
    if not ms:
        return message_figure("no recorded forward sweep yet")
    all_b = sorted({b for (_, b, _) in ms})
    layers = layer_order(l for (l, _, _) in ms)
    fig = go.Figure()
    traces_per_b = 0
    default_b = 512 if 512 in all_b else all_b[-1]
    for b in all_b:
        count = 0
        for base, r2, r4 in pairs:
            for cfg in (r2, r4):
                if cfg is None:
                    continue
                ys = [round4(ms[(l, b, cfg)] / ms[(l, b, (base, cfg))]) if (l, b, cfg) in ms else None
                      for l in layers]
                fig.add_trace(go.Bar(x=layers, y=[None if y is None else round4(y - 1.0) for y in ys], base=1.0,
                                     customdata=ys,
                                     hovertemplate="%{x}: %{customdata:.2f}x<extra>%{fullData.name}</extra>",
                                     name=f"{kernel_label(cfg)} (over r = 1)", visible=b == default_b))
                count += 1
        traces_per_b = count
    fig.add_hline(y=1.0, line=dict(color="black", width=1))
    fig.update_layout(barmode="group", margin=dict(l=10, r=10, b=10),
                      xaxis_title="layer", yaxis_title="kernel time over r = 1's (×)",
                      updatemenus=batch_menu(all_b, traces_per_b, default_b))
    figure_layout.headed(fig, height, "Kernel time with r = 2 or 4 over r = 1 (below 1: reuse paid)",
                         recorded_message(sweep))
    return fig


def heuristic_figure(records: Optional[List[dict]] = None, height: int = 460) -> go.Figure:
    """Heat map over (layer, B) of the recorded kernel time of the heuristic's pick over the fastest
    recorded config (1.00 = the heuristic found the best); the cell text names the pick."""
    records = forward_records() if records is None else records
    rows = heuristic_table(records)
    if not rows:
        return message_figure("no recorded forward sweep yet")
    layers = layer_order(r["layer"] for r in rows)
    bs = sorted({r["B"] for r in rows})
    family = _common_family([r["pick"] for r in rows])
    z, text, hover = [], [], []
    for l in layers:
        zr, tr, hr = [], [], []
        for b in bs:
            r = next((x for x in rows if x["layer"] == l and x["B"] == b), None)
            zr.append(round4(r["ratio"]) if r and r["ratio"] else None)
            words = _cell_words(r["pick"], family) if r else ""
            tr.append(f"{words}<br>{r['ratio']:.2f}x" if r and r["ratio"] else (words + "<br>not swept" if r else ""))
            hr.append(f"{l} B={b}: {short_label(r['pick'])} ({r['pick']})" if r else "")
        z.append(zr)
        text.append(tr)
        hover.append(hr)
    fig = go.Figure(go.Heatmap(z=z, x=[f"B={b}" for b in bs], y=layers, text=text, texttemplate="%{text}",
                               customdata=hover, hovertemplate="%{customdata}: %{z:.2f}x<extra></extra>",
                               textfont=dict(size=9), colorscale=[[0, "#f7fbff"], [1, "#d62728"]], zmin=1.0, zmax=2.0,
                               colorbar=dict(title="pick / best")))
    fig.update_yaxes(autorange="reversed", title_text="layer")
    fig.update_xaxes(title_text="batch")
    fig.update_layout(margin=dict(l=10, r=10, b=10))
    figure_layout.headed(fig, max(height, 56 * len(layers) + 130),
                         "Kernel time of the heuristic's pick over the fastest recorded config",
                         recorded_message(sweep_records(records), f"every pick: {family}" if family else None),
                         legend=None)
    return fig


def _common_family(configs: Sequence[str]) -> str:
    """The leading words without digits (the family, ``"tensor cores"``) that every config's short label starts
    with, else ``""``."""
    words = [short_label(c).split(" ") for c in configs]
    head: List[str] = []
    for i, w in enumerate(words[0] if words else []):
        if any(ch.isdigit() for ch in w) or any(len(x) <= i + 1 or x[i] != w for x in words):
            break
        head.append(w)
    return " ".join(head)


def _cell_words(config: str, family: str, width: int = 18) -> str:
    """A config in words for a heat-map cell: its short label less the ``family`` every cell shares, its phrases
    joined into lines of about ``width`` characters (``<br>`` between them)."""
    words = short_label(config)
    if family and words.startswith(family + " "):
        words = words[len(family) + 1:]
    lines: List[str] = []
    for phrase in words.split(", "):
        if lines and len(lines[-1]) + 2 + len(phrase) <= width:
            lines[-1] += ", " + phrase
        else:
            lines.append(phrase)
    return "<br>".join(lines)
