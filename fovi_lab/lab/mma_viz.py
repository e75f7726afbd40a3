"""Notebooks 09 and 10: tensor cores by hand, the ``mma.sync`` forward kernels of
:mod:`fovi_lab.kernels.forward.mma`, and how they are tuned (logic and figures).

Notebook 09, the kernel:

* :func:`fragment_figure`: which lane holds which element of the A, B and D fragments of one
  ``mma.sync.m16n8k16`` (the layout the PTX ISA fixes), and how the kernel fills them.
* :func:`lane_channels`: the channel permutation that makes a lane's W loads one vector load.
* :func:`explore_mma`: run one mma config on a real layer's shape here, against the fp32 reference.
* :func:`layout_rows` / :func:`layout_figure`: what each operand layout bought: the same block with x in place or
  x^T, W^T or W in place, replayed side by side.

Notebook 10, the tuning:

* :func:`depth_rows` / :func:`depth_figure` / :func:`register_rows`: what the loop depth bought (the same block
  looping 1, 2 or 4 k-steps per iteration, replayed side by side in the tensor-core sweep) and what it costs in registers
  and resident warps (the sm_90 cubins).
* :func:`stage_rows` / :func:`stage_figure`: what the staged store bought (the same block writing y directly or
  through a shared tile, replayed side by side: the staged-store sweep); :func:`ncu_rows`: the Nsight Compute profile
  that pointed at the stores.
* :func:`mma_rows` / :func:`mma_figure`: the recorded H200 sweeps: per layer and batch, the mma pick's whole op
  replayed from a CUDA graph (the tensor-core sweep), the tile / SIMT rules' pick (their runs) and the fastest
  PyTorch forward, replayed too, medians over the runs that measured them.
* :func:`mma_widget` / :func:`explore_mma_widget` / :func:`widget_figure`: the notebook's widget: one layer, batch
  and mma config run here, the pick for that shape, and a figure marking that batch and kernel on the layer's
  recorded replays, with the live time beside the recorded one.

Notebook 09's fragments, lanes and live run are :mod:`fovi_lab.lab.mma_kernel_viz`'s (their names are given here too);
this module reads the recorded sweeps and runs the widget.
"""

from __future__ import annotations

import functools
import os
import statistics
import tomllib
from typing import Dict, List, Optional, Sequence, Tuple

import plotly.graph_objects as go

import fovi_lab.lab.figure_layout as figure_layout
from fovi_lab.lab.common import readable_log_axes
from fovi_lab import lab as kl
from fovi_lab.graph.layers import RECORDED_LAYERS, layer_meta
from fovi_lab.lab.labels import kernel_label, short_label
from fovi_lab.lab.mma_kernel_viz import (explore_mma, fragment_figure, fragment_owner, lane_channels,  # noqa: F401
                                       mma_configs, operand_mb)

__all__ = ["LAYERS", "fragment_owner", "fragment_figure",
           "lane_channels", "explore_mma", "mma_rows", "mma_figure", "layout_rows", "layout_figure",
           "depth_rows", "depth_figure",
           "register_rows", "stage_rows", "stage_figure", "ncu_rows", "explore_mma_widget", "widget_figure",
           "mma_widget", "mma_configs",
           "mma_summary", "operand_mb", "dense_ceiling_rows"]

# The recorded sweeps read here (fovi_lab.lab.records.SELECTIONS): "tensor-core sweep" (every mma config, loops of
# 1, 2 and 4 k-steps, beside the pick and PyTorch on every layer at B = 1 to 512; it also timed every loop depth side
# by side), "staged-store sweep", "tile and SIMT rules" (the runs whose chosen config was the tile / SIMT rules'
# pick, FOVI_WARP_MMA=off) and "tensor-core layouts".
LAYERS = RECORDED_LAYERS


# ----------------------------------------------------------------------------------------------- recorded

def _sel(records: List[dict], name: str) -> List[dict]:
    """The records of one recorded sweep (:data:`fovi_lab.lab.records.SELECTIONS`)."""
    return kl.SELECTIONS[name].pick(records)


def _by_shape(records: List[dict]) -> Dict[Tuple[str, int], List[dict]]:
    out: Dict[Tuple[str, int], List[dict]] = {}
    for r in records:
        if r.get("ms") and r.get("layer") in LAYERS:
            out.setdefault((r["layer"], r["B"]), []).append(r)
    return out


def _median_by(rs: List[dict], key, pred) -> Dict[str, float]:
    per: Dict[str, List[float]] = {}
    for r in rs:
        if pred(r):
            per.setdefault(key(r), []).append(r["ms"])
    return {k: statistics.median(v) for k, v in per.items()}


def _replayed(rs: List[dict]) -> Dict[str, float]:
    """Per config, the median of its whole ops replayed from CUDA graphs among ``rs``."""
    return _median_by(rs, lambda r: r["config"], lambda r: r["impl"] == "warp_uncached_graphed")


def _pair_rows(records: Optional[List[dict]], sweep: str, points, keys: Tuple[str, str], extra=None) -> List[dict]:
    """Per point ``(layer, B, config, other config)`` of a recorded ``sweep`` (:func:`_sel`): where both configs'
    whole ops replayed, a row ``layer, B, <keys[0]>`` (the config), ``<keys[0]>_ms`` (its median), the same for
    ``keys[1]``, ``speedup`` (the first median over the second), the fields of ``extra(B, rs)`` and ``records``
    (``rs``, the point's records: the figure's versions line)."""
    records = kl.forward_records() if records is None else records
    shapes = _by_shape(_sel(records, sweep))
    one, other = keys
    rows = []
    for layer, b, c1, c2 in points:
        rs = shapes.get((layer, b), [])
        med = _replayed(rs)
        if c1 in med and c2 in med:
            row = {"layer": layer, "B": b, one: c1, f"{one}_ms": med[c1], other: c2, f"{other}_ms": med[c2],
                   "speedup": med[c1] / med[c2]}
            row.update(extra(b, rs) if extra else {})
            rows.append(dict(row, records=rs))
    return rows


def _pair_series(specs):
    """The ``series`` of :func:`_bars_figure` for rows of :func:`_pair_rows`: per ``(ms key, config key, name,
    colour)`` of ``specs``, the bars ``(name, colour, µs per row, config per row)``."""
    return lambda rs: [(name, colour, [r[key] * 1e3 for r in rs], [r[cfg] for r in rs])
                       for key, cfg, name, colour in specs]


def mma_rows(records: Optional[List[dict]] = None, batches: Sequence[int] = (1, 16, 64, 512)) -> List[dict]:
    """Per layer and batch, medians of whole ops replayed from CUDA graphs: the register mma rule's pick
    (``select_config(..., pipe=False)``: the kernels this notebook builds; the pipelined ones that the rule takes
    on the large-GEMM layers from B = 64 were timed in their own run, ``data/h200/forward_pipe.jsonl.gz``) (over
    the tensor-core sweep; ``tflops``: the compact GEMM's ``2*B*P64*Cout*Nout`` FLOPs over its time), the tile / SIMT
    rules' pick (over their runs, where it was the run's chosen config) and the fastest PyTorch forward
    (over the tensor-core sweep)."""
    from fovi_lab.kernels import forward as F
    records = kl.forward_records() if records is None else records
    shapes = _by_shape(_sel(records, "tensor-core sweep") + _sel(records, "tile and SIMT rules"))
    rows = []
    for layer in LAYERS:
        for b in batches:
            rs = shapes.get((layer, b), [])
            shape = next((r for r in rs if r.get("cin") is not None and r.get("v") is not None), None)
            if shape is None:
                continue
            args = (b, shape["cout"], shape["nout"], shape["p64"])
            kw = dict(in_channels=shape["cin"], node_major=shape["cin"] >= 32, q=shape["cin"] * shape["v"])
            pick = F.select_config(*args, pipe=False, **kw)      # the register kernels: what the sweep timed
            old = F.select_config(*args, mma=False, **kw)
            now = _sel(rs, "tensor-core sweep")
            warp = _replayed(now)
            old_ms = _replayed(_sel(rs, "tile and SIMT rules")).get(old)
            tmed = _median_by(now, lambda r: r["impl"], lambda r: str(r["impl"]).startswith("torch") and r.get("graphed"))
            tbest = min(tmed, key=tmed.get) if tmed else None
            ms = warp.get(pick)
            flops = 2.0 * b * shape["p64"] * shape["cout"] * shape["nout"]     # the compact GEMM's work
            rows.append(dict(layer=layer, B=b, pick=pick, ms=ms, old_config=old, old_ms=old_ms,
                             torch_impl=tbest, torch_ms=tmed.get(tbest), tflops=(flops / ms / 1e9) if ms else None,
                             vs_old=(old_ms / ms) if ms and old_ms else None,
                             vs_torch=(tmed[tbest] / ms) if ms and tbest else None, records=rs))
    return rows


def mma_summary(rows: Optional[List[dict]] = None) -> List[dict]:
    """Per batch of :func:`mma_rows`: how many layers were recorded (``layers``) and on how many the pick beat the
    fastest PyTorch forward (``faster``), the range of the pick's speedup over PyTorch (``vs_torch``) and over the
    tile / SIMT rules' pick (``vs_old``) as ``(min, max)``, and the layers where PyTorch won (``losses``)."""
    rows = mma_rows() if rows is None else rows
    out = []
    for b in sorted({r["B"] for r in rows}):
        rs = [r for r in rows if r["B"] == b]
        vt = [r["vs_torch"] for r in rs if r["vs_torch"]]
        vo = [r["vs_old"] for r in rs if r["vs_old"]]
        out.append(dict(B=b, layers=len(rs), faster=sum(v > 1 for v in vt),
                        vs_torch=(min(vt), max(vt)) if vt else None, vs_old=(min(vo), max(vo)) if vo else None,
                        losses=[r["layer"] for r in rs if r["vs_torch"] and r["vs_torch"] <= 1]))
    return out


#: (layer, B) where PyTorch's batched GEMM on cached effective weights beat the pick at B = 64.
CEILING_POINTS = (("res18_layer3", 64), ("res18_layer3_0", 64))


def dense_ceiling_rows(records: Optional[List[dict]] = None, points=CEILING_POINTS) -> List[dict]:
    """Per point, from the latest benchmark run that timed it with a register mma kernel as the pick
    (``python -m fovi_lab bench forward``): the chosen config, its loop over dense operands (``warp_dense_ceiling``: no gathers), the op replayed from a CUDA graph,
    and the fastest PyTorch forward replayed in the same run."""
    from fovi_lab.kernels import forward as F
    records = kl.forward_records() if records is None else records
    runs = kl.record_runs([r for r in records if r.get("layer") in {p[0] for p in points}])
    rows = []
    for layer, b in points:
        run = kl.latest_run_where(runs.get((layer, b, None), []),      # a run whose pick was a register kernel
                                  lambda run: any(r.get("impl") == "warp_dense_ceiling" and r.get("ms")
                                                  and r.get("config")
                                                  and F.config_spec(r["config"]).variant in F.MMA_VARIANTS
                                                  for r in run))
        if run is None:
            continue
        dense = next(r for r in run if r.get("impl") == "warp_dense_ceiling" and r.get("ms"))
        graphed = next((r["ms"] for r in run if r.get("impl") == "warp_uncached_graphed" and r.get("ms")), None)
        torch_rows = [r for r in run if str(r.get("impl")).startswith("torch") and r.get("graphed") and r.get("ms")]
        t = min(torch_rows, key=lambda r: r["ms"]) if torch_rows else None
        rows.append(dict(layer=layer, B=b, config=dense.get("config"), dense_ms=dense["ms"], ms=graphed,
                         torch_impl=t and t["impl"], torch_ms=t and t["ms"], date=str(dense.get("date", ""))[:10]))
    return rows


#: The recorded series of the mma figures: (ms key, config key, name, colour).
_SERIES = (("ms", "pick", "mma pick", "#2ca02c"),
           ("old_ms", "old_config", "the tile / SIMT rule's pick", "#1f77b4"),
           ("torch_ms", "torch_impl", "fastest PyTorch", "#d62728"))


def mma_figure(rows: Optional[List[dict]] = None, height: int = 540) -> go.Figure:
    """Grouped bars, one panel per batch: per layer the mma pick, the tile / SIMT rules' pick and the fastest PyTorch
    forward, whole ops replayed from CUDA graphs (ms, log scale)."""
    rows = mma_rows() if rows is None else rows
    if not rows:
        return kl.message_figure("no recorded mma sweep in the records")
    return kl.batch_panels_figure(rows, _SERIES, "The tensor-core rule's picks against the tile / SIMT kernels and "
                                  "PyTorch", "whole ops, medians of the recorded H200 replays: the tensor-core sweep "
                                  "and the tile / SIMT rules' runs", height=height)


def _points(table: str) -> Tuple[tuple, ...]:
    """One table of ``mma_points.toml`` (package data beside this module), as tuples."""
    with open(os.path.join(os.path.dirname(__file__), "mma_points.toml"), "rb") as f:
        return tuple(tuple(row) for row in tomllib.load(f)[table])


#: (layer, B, the baseline config, the config with the other layout): what x^T and W in place buy.
LAYOUT_PAIRS = _points("layout_pairs")


def layout_rows(records: Optional[List[dict]] = None, pairs=LAYOUT_PAIRS) -> List[dict]:
    """Per pair of :data:`LAYOUT_PAIRS`: both configs' whole ops replayed, medians over the runs that replayed
    both (the tensor-core layouts sweep)."""
    return _pair_rows(records, "tensor-core layouts", pairs, ("base", "other"))


def layout_figure(rows: Optional[List[dict]] = None, height: int = 440) -> go.Figure:
    """Grouped bars: per pair of :func:`layout_rows`, the block reading x in place and W^T beside the same block with
    its other layout, x^T or W in place (µs per op, replayed)."""
    rows = layout_rows() if rows is None else rows
    layouts = (("base_ms", "base", "x in place, W^T (a per-call copy)", "#bdbdbd"),
               ("other_ms", "other", "the other layout: x^T or W in place", "#31a354"))
    return _bars_figure(rows, "no recorded layout replays under data/",
                        lambda rs: [f"{r['layer']} B={r['B']}<br>{short_label(r['other'], title=False)}" for r in rs],
                        _pair_series(layouts),
                        "Operand layouts: the same block reading x in place and W^T, or x^T or W in place",
                        height=height, log=True, xtitle="layer, batch and the other layout's block")


#: The batches the tensor-core sweep timed on every layer: the widget's recorded sweep.
WIDGET_BATCHES = (1, 4, 16, 32, 64, 128, 512)


@functools.lru_cache(maxsize=1)
def _widget_points() -> Dict[str, dict]:
    """Per layer, what the widget's figure reads from the records (read once per kernel process): ``rows``, the
    :func:`mma_rows` of the layer at :data:`WIDGET_BATCHES`, and ``replays``, ``{(B, config): (ms, where)}``: each
    config's whole op replayed, medians over the tensor-core sweep where it timed that point, else over every
    recorded H200 replay of it (the pipelined configs and benchmark runs)."""
    records = kl.forward_records()
    rows = mma_rows(records, batches=WIDGET_BATCHES)
    sweep = _by_shape(_sel(records, "tensor-core sweep"))
    every = _by_shape(records)
    out: Dict[str, dict] = {}
    for layer in LAYERS:
        replays: Dict[Tuple[int, str], Tuple[float, str]] = {}
        for b in sorted({b for lay, b in every if lay == layer}):
            for cfg, ms in _replayed(every[(layer, b)]).items():
                replays[(b, cfg)] = (ms, "the recorded H200 replays")
            for cfg, ms in _replayed(sweep.get((layer, b), [])).items():
                replays[(b, cfg)] = (ms, "the tensor-core sweep")
        out[layer] = dict(rows=[r for r in rows if r["layer"] == layer], replays=replays)
    return out


def _rule_pick(layer: str, batch: int) -> str:
    """The rule's pick for ``layer``'s full shape at ``batch`` (what :func:`explore_mma` runs for ``config=None``)."""
    from fovi_lab.kernels import forward as F
    m = layer_meta(layer)
    return F.select_config(batch, m.cout, m.nout, m.p64, in_channels=m.cin, node_major=m.cin >= 32, q=m.q)


def explore_mma_widget(layer: str, batch: int, config: Optional[str] = None, device=None,
                       budget: float = kl.CPU_WORK_BUDGET) -> Tuple[List[str], go.Figure]:
    """One widget run: ``config`` (None: the pick) on ``layer`` at ``batch`` here, on the first 48 output nodes
    on a CPU (all of them on a GPU), and the figure of that run (:func:`widget_figure`): the layer's recorded
    replays over B with the chosen batch and kernel marked, and the live time beside the recorded one. Returns
    ``(lines, figure)``; a choice outside the offered ones, or more work than ``budget`` on the CPU, gives a
    message line instead (the figure then marks the batch without a live time)."""
    ran: Dict[str, dict] = {}

    def run(*args, **kw):
        ran["res"] = explore_mma(*args, **kw)
        return ran["res"]

    lines, _ = kl.layer_kernel_widget(layer, batch, config, layers=LAYERS, configs=mma_configs(), run=run,
                                      figure=None, cpu_nodes=48, device=device, budget=budget, none_is_pick=True)
    return lines, widget_figure(layer, batch, ran.get("res"), config=config)


def widget_figure(layer: str, batch: int, result: Optional[dict] = None, config: Optional[str] = None,
                  height: int = 560) -> go.Figure:
    """The widget's figure for one choice. Left: ``layer``'s recorded H200 replays over B (the rule's register
    pick, the tile / SIMT rules' pick, the fastest PyTorch forward; log-log), a dashed line at ``batch`` and a star
    at the recorded time of the kernel that ran there (and of the rule's pick, where that is another one). Right:
    that kernel's recorded time beside ``result``'s live time here (:func:`explore_mma`'s dict; None: no live
    run). Config ids stay in hover texts; every label is words (:func:`fovi_lab.lab.labels.kernel_label`). The
    legend stands between the title and the plot; what ran and what the rule picks, under the plot."""
    from plotly.subplots import make_subplots
    if layer not in LAYERS:
        return kl.message_figure(f"no recorded mma runs for {layer!r}")
    points = _widget_points()[layer]
    rows, replays = points["rows"], points["replays"]
    ok_batch = isinstance(batch, int) and not isinstance(batch, bool) and 1 <= batch <= 512
    pick = result["pick"] if result else (_rule_pick(layer, batch) if ok_batch else None)
    chosen = result["config"] if result else (config if config in mma_configs() else pick)
    fig = make_subplots(rows=1, cols=2, column_widths=[0.64, 0.36], horizontal_spacing=0.12,
                        subplot_titles=("recorded over B (whole layer, replayed)", f"B = {batch}: recorded and live"))
    ys = []
    for key, cfg_key, name, colour in _SERIES:
        pts = [(r["B"], r[key], r.get(cfg_key)) for r in rows if r.get(key)]
        if not pts:
            continue
        ys += [ms for _, ms, _ in pts]
        fig.add_trace(go.Scatter(x=[b for b, _, _ in pts], y=[ms for _, ms, _ in pts], name=name,
                                 mode="lines+markers", line=dict(color=colour), customdata=[c for _, _, c in pts],
                                 hovertemplate="B=%{x}: %{y:.3f} ms (%{customdata})<extra>" + name + "</extra>"),
                      row=1, col=1)
    marks = [(chosen, "the kernel that ran" if result else "the chosen kernel", "#ff7f0e", "star")]
    if pick and pick != chosen:
        marks.append((pick, "the rule's pick", "#2ca02c", "diamond"))
    recorded = None
    for cfg, who, colour, symbol in marks:
        hit = replays.get((batch, cfg)) if cfg else None
        if hit is None:
            continue
        ys.append(hit[0])
        if cfg == chosen:
            recorded = hit
        fig.add_trace(go.Scatter(x=[batch], y=[hit[0]], mode="markers", name=f"B = {batch}: {who}, recorded",
                                 marker=dict(symbol=symbol, size=16, color=colour, line=dict(width=1, color="black")),
                                 customdata=[f"{cfg}, {hit[1]}"],
                                 hovertemplate="B=%{x}: %{y:.3f} ms (%{customdata})<extra></extra>"), row=1, col=1)
    if ok_batch and ys:
        lo, hi = min(ys), max(ys)
        fig.add_trace(go.Scatter(x=[batch, batch], y=[lo / 1.5, hi * 1.5], mode="lines", name=f"your batch: B = {batch}",
                                 line=dict(color="black", dash="dash", width=1), hoverinfo="skip"), row=1, col=1)
    rec_ms = recorded[0] if recorded else None
    live_ms = result["ms"] if result else None
    if rec_ms or live_ms:
        where = f"live here ({result['device']}, {result['nodes']} nodes)" if result else "live here"
        fig.add_trace(go.Bar(x=["recorded, H200<br>(whole layer)", where.replace(" (", "<br>(")],
                             y=[rec_ms, live_ms], marker_color=["#ff7f0e", "#7f7f7f"], showlegend=False,
                             text=[f"{v:.3f} ms" if v else "" for v in (rec_ms, live_ms)], textposition="outside",
                             customdata=[recorded[1] if recorded else "not recorded", "this run"],
                             hovertemplate="%{y:.3f} ms (%{customdata})<extra></extra>", name=f"B = {batch}"),
                      row=1, col=2)
    notes = []
    if chosen:
        notes.append(("ran" if result else "chosen") + ": " + kernel_label(chosen))
    if pick and pick != chosen:
        notes.append("the rule picks: " + kernel_label(pick))
    if chosen and rec_ms is None:
        notes.append(f"no H200 replay of it at B = {batch} on record")
    if not result:
        notes.append("no live run for this choice")
    recs = [rec for r in rows for rec in r["records"]]
    fig.update_xaxes(type="log", tickvals=list(WIDGET_BATCHES), title_text="batch B (samples)", row=1, col=1)
    fig.update_yaxes(type="log", title_text="time per op (ms)", row=1, col=1)
    fig.update_yaxes(type="log", title_text="time per op (ms)", row=1, col=2)
    fig.update_xaxes(tickangle=0, title_text="where it ran", row=1, col=2)
    band = 80                                       # tick labels (two lines on the right) and the axis titles
    bottom = band + int(len(notes) * 1.3 * 11) + 10
    fig.update_layout(margin=dict(b=bottom))
    top = figure_layout.headed(fig, height, f"{layer}, B = {batch}: the chosen kernel on the recorded sweep",
                               kl.recorded_message(recs, "tensor-core sweep and tile / SIMT rules' runs, medians"))
    fig.add_annotation(text="<br>".join(notes), xref="paper", yref="paper", x=0.0, y=-band / (height - top - bottom),
                       showarrow=False, align="left", xanchor="left", yanchor="top", font=dict(size=11))
    return readable_log_axes(fig)


def mma_widget(layer: str = "alex_L0", batch: int = 16, config: str = "pick", device=None):
    """The notebook's widget: a layer, a batch and a config (``"pick"``: the rule's); each change re-runs
    :func:`explore_mma_widget` (the real kernel, here) and redraws its figure, the status line saying so while it
    runs (:func:`fovi_lab.lab.common.live`). The panel starts with the default choice already run; ``panel.last``
    holds the latest ``(lines, figure)``."""
    import ipywidgets as W
    from IPython.display import display
    layer_dd = W.Dropdown(options=LAYERS, value=layer, description="layer")
    batch_sl = W.IntSlider(value=batch, min=1, max=64, description="batch", continuous_update=False)
    config_dd = W.Dropdown(options=[("the rule's pick", "pick")] + [(short_label(c), c) for c in mma_configs()],
                           value=config, description="config")

    def run(layer, batch, config):
        lines, fig = explore_mma_widget(layer, batch, None if config == "pick" else config, device=device)
        print("\n".join(lines))
        display(fig)
        return lines, fig

    return kl.live(run, dict(layer=layer_dd, batch=batch_sl, config=config_dd),
                   arrange=W.HBox([layer_dd, batch_sl, config_dd]))


# ----------------------------------------------------------------------------------------------- loop depth

#: (layer, B, the block's configs at 1, 2 and 4 k-steps per iteration, None where not built): what the loop
#: depth buys on a few-hundred-warp grid, and where the deeper loop's registers cost a wave (alexnet L1 at B = 64).
DEPTH_POINTS = (
    ("alex_L2", 16, ("mmat_o64b16", "mmat_o64b16k32", "mmat_o64b16k64")),
    ("res18_layer3", 128, ("mmat_o64b16", "mmat_o64b16k32", "mmat_o64b16k64")),
    ("res18_layer1", 4, ("mma_o32b8", "mma_o32b8k32", "mma_o32b8k64")),
    ("dinov3_patch", 16, ("mma_o32b8", "mma_o32b8k32", "mma_o32b8k64")),
    ("alex_L0", 64, ("mmat_o96b32", "mmat_o96b32k32", None)),
    ("alex_L1", 64, ("mmat_o96b32", "mmat_o96b32k32", None)),
)


def depth_rows(records: Optional[List[dict]] = None, points=DEPTH_POINTS) -> List[dict]:
    """Per point of :data:`DEPTH_POINTS`: the whole op replayed at each loop depth, medians over
    the tensor-core sweep (every depth timed side by side), the deepest loop's speedup over the 1-deep one, and the
    records read (``records``: the figure's versions line)."""
    records = kl.forward_records() if records is None else records
    shapes = _by_shape(_sel(records, "tensor-core sweep"))
    rows = []
    for layer, b, configs in points:
        rs = shapes.get((layer, b), [])
        med = _replayed(rs)
        ms = [med.get(c) if c else None for c in configs]
        if ms[0] is None:
            continue
        best = min((m, 16 << i) for i, m in enumerate(ms) if m)
        rows.append(dict(layer=layer, B=b, configs=configs, ms=ms, best_depth=best[1], speedup=ms[0] / best[0],
                         records=rs))
    return rows


def _bars_figure(rows: List[dict], empty: str, xs, series, title: str, height: int, log: bool = False,
                 xtitle: str = "layer and batch", message: Optional[str] = None) -> go.Figure:
    """Grouped bars of ``series(rows)`` (``(name, colour, µs per x, config per x)``) over ``xs(rows)`` (the x axis
    titled ``xtitle``), replayed µs per op; under the title ``title``, ``message`` and the versions of the records
    the ``rows`` read; the ``empty`` message without rows. The legend sits between the title and the plot, clear of
    the (two-line) tick labels under it."""
    if not rows:
        return kl.message_figure(empty)
    xs, series = xs(rows), series(rows)
    fig = go.Figure()
    for name, colour, ys, configs in series:
        fig.add_trace(go.Bar(x=xs, y=ys, name=name, marker_color=colour, customdata=configs,
                             hovertemplate="%{customdata}: %{y:.1f} µs<extra></extra>"))
    fig.update_layout(barmode="group", yaxis_title="time per op (µs)", xaxis_title=xtitle,
                      yaxis_type="log" if log else None, margin=dict(b=60))
    recs = [rec for r in rows for rec in r["records"]]
    note = "medians of the whole ops replayed from CUDA graphs"
    figure_layout.headed(fig, height, title, (message + " · " if message else "") + kl.recorded_message(recs, note))
    return readable_log_axes(fig)


def _tile_phrase(config: str) -> str:
    """The tile of a tensor-core config in words (its readable name's first phrase after the family)."""
    return kernel_label(config, title=False).split(", ")[0]


def depth_figure(rows: Optional[List[dict]] = None, height: int = 440) -> go.Figure:
    """Grouped bars: per point, the same block looping 16, 32 and 64 p entries per iteration (µs, replayed)."""
    rows = depth_rows() if rows is None else rows
    depths = (("1 k-step: 16 p entries per iteration", "#9ecae1"), ("2 k-steps: 32 p entries per iteration", "#4292c6"),
              ("4 k-steps: 64 p entries per iteration", "#08519c"))
    return _bars_figure(rows, "no recorded loop-depth replays under data/",
                        lambda rs: [f"{r['layer']} B={r['B']}<br>{_tile_phrase(r['configs'][0])}" for r in rs],
                        lambda rs: [(name, colour, [(r["ms"][i] or 0) * 1e3 or None for r in rs],
                                     [r["configs"][i] for r in rs]) for i, (name, colour) in enumerate(depths)],
                        "Loads in flight: the same block looping 1, 2 or 4 k-steps per iteration", height=height,
                        xtitle="layer, batch and tile")


def register_rows(path=None) -> List[dict]:
    """The sm_90 cubins' registers per thread, spill bytes and resident warps per SM (128-thread blocks), from
    the shipped ``logs/mma_registers_sm90.txt`` (``tools/cubin_registers.py``): ``[]`` when absent."""
    path = kl.LOGS_DIR / "mma_registers_sm90.txt" if path is None else path
    rows = []
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if line.startswith("#") or len(parts) != 4:
                    continue
                rows.append(dict(kernel=parts[0], regs=int(parts[1]), local_bytes=int(parts[2]),
                                 warps_per_sm=int(parts[3])))
    except OSError:
        return []
    return rows


# ----------------------------------------------------------------------------------------------- staged store

#: (layer, B, the block writing y directly, the same block writing it through a shared tile).
STAGE_POINTS = _points("stage_points")


def stage_rows(records: Optional[List[dict]] = None, points=STAGE_POINTS) -> List[dict]:
    """Per point of :data:`STAGE_POINTS`: both blocks' whole ops replayed, medians over the staged-store sweep, the
    staged store's speedup, the output's share of the op's bytes (y against x, W and the tables), and the records
    read (``records``)."""
    def y_share(b: int, rs: List[dict]) -> dict:
        shape = next((r for r in rs if r.get("nout")), {})
        y_bytes = 2.0 * b * shape.get("cout", 0) * shape.get("nout", 0)
        return dict(y_share=(y_bytes / shape["bytes"]) if shape.get("bytes") else None)

    return _pair_rows(records, "staged-store sweep", points, ("direct", "staged"), y_share)


def stage_figure(rows: Optional[List[dict]] = None, height: int = 440) -> go.Figure:
    """Grouped bars: per point, the block writing y directly and through the shared tile (µs, replayed)."""
    rows = stage_rows() if rows is None else rows
    stores = (("direct_ms", "direct", "each lane stores its own outputs", "#fdae6b"),
              ("staged_ms", "staged", "staged through a shared tile", "#e6550d"))
    return _bars_figure(rows, "no recorded staged-store replays under data/",
                        lambda rs: [f"{r['layer']} B={r['B']}" for r in rs], _pair_series(stores),
                        "The staged store: y written in runs of adjacent nodes",
                        height=height, log=True, message="instead of one 2-byte store per sector")


#: The Nsight Compute metrics the notebook reads (summary lines ``section|metric  value unit``).
NCU_METRICS = {
    "Duration": "GPU Speed Of Light|Duration",
    "L2 throughput %": "GPU Speed Of Light|L2 Cache Throughput",
    "L1 throughput %": "GPU Speed Of Light|L1/TEX Cache Throughput",
    "store requests": "Command line profi|l1tex__t_requests_pipe_lsu_mem_global_op_st.sum",
    "store sectors": "Command line profi|l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum",
    "load sectors": "Command line profi|l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
    "tensor pipe %": "Command line profi|sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "warps per SM": "Occupancy|Achieved Active Warps Per SM",
    "grid (blocks)": "Launch Statistics|Grid Size",
}


def ncu_rows(path=None, metrics=NCU_METRICS) -> List[dict]:
    """Per profiled kernel (the shipped ``logs/ncu_mma_picks_summary.txt``, a summary of Nsight Compute's CSV from
    ``bash tools/gpu/run.sh ncu``): the kernel name and the :data:`NCU_METRICS` values (floats; ``[]`` when the
    file is absent)."""
    import re
    path = kl.LOGS_DIR / "ncu_mma_picks_summary.txt" if path is None else path
    rows: List[dict] = []
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return rows
    want = {v: k for k, v in metrics.items()}
    for line in lines:
        if line.startswith("("):
            name = line.split("'")[3].split("_cuda")[0]
            rows.append({"kernel": name.rsplit("_", 1)[0] if name.count("_") > 3 else name})
        elif rows:
            m = re.match(r"^(\S.*?)\s+([\d,.]+)(?:\s+\S+)?$", line.strip())   # "section|metric  value [unit]"
            if m and m.group(1) in want:
                rows[-1][want[m.group(1)]] = float(m.group(2).replace(",", ""))
    return rows
