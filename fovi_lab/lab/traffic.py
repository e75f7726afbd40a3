"""Models of the forward's work: FLOPs and the fewest bytes, the bytes a tiled kernel gathers per call
(by tile shape and weight reuse ``r``), its shared memory, and one node's GEMM.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from fovi_lab.graph.meta import TrainingMeta, pad_to
from fovi_lab.kernels.families.tile_gemm import tile_bill
import fovi_lab.lab.figure_layout as figure_layout
from fovi_lab.lab.common import COLOURS, round4
from fovi_lab.lab.problems import make_meta


def shape_of(meta_or_layer, cout: Optional[int] = None, rf: Optional[str] = None) -> dict:
    """``{cin, cout, nin, nout, k, v, p, p64, q}`` of a meta or a layer name."""
    meta = make_meta(meta_or_layer, cout, rf) if isinstance(meta_or_layer, str) else meta_or_layer
    return {k: int(getattr(meta, k)) for k in ("cin", "cout", "nin", "nout", "k", "v", "p", "p64", "q")}


def forward_counts(shape: dict, batch: int, itemsize: int = 2) -> dict:
    """FLOPs of the compact forward (``2 B P64 Cout Nout``), the fewest bytes it must move (x, W, bias,
    both int32 tables and y once each), their ratio, and the same for the inference cache (``Weff``
    read instead of W) and for the dense baseline (depth ``Q`` instead of ``P64``)."""
    b = int(batch)
    s = shape
    flops = 2.0 * b * s["p64"] * s["cout"] * s["nout"]
    tables = 2 * 4 * s["nout"] * s["p64"]
    xy = itemsize * (b * s["cin"] * s["nin"] + b * s["cout"] * s["nout"] + s["cout"])
    w_bytes = itemsize * s["cout"] * s["q"]
    weff_bytes = itemsize * s["nout"] * s["p64"] * pad_to(s["cout"], 64)
    nbytes = float(xy + w_bytes + tables)
    return {
        "flops": flops, "bytes": nbytes, "intensity": flops / nbytes,
        "w_bytes": float(w_bytes), "weff_bytes": float(weff_bytes),
        "cached_bytes": float(xy + weff_bytes + tables / 2), "cached_intensity": flops / (xy + weff_bytes + tables / 2),
        "dense_flops": 2.0 * b * s["q"] * s["cout"] * s["nout"],
    }


def tile_smem_estimate(tile_m: int, tile_n: int, r: int = 1, tile_k: int = 64, cached: bool = False) -> int:
    """Lower-bound estimate of the tile memory one CTA of the gather (or cached) kernel reserves:
    ``r`` A tiles + one W tile (fp16), ``r`` fp32 accumulators, index tiles and bias (notebook 03
    derives this bill and checks it against Warp's own count; Warp's count is at least this)."""
    return tile_bill(tile_m, tile_n, tile_k, r, index_tiles=1 if cached else 2)


def tile_traffic(shape: dict, batch: int, tile_m: int, tile_n: int, r: int = 1, cached: bool = False,
                 tile_k: int = 64) -> dict:
    """Bytes one call of the tiled forward kernel gathers into its tiles, by stream.

    Grid ``(Nout, ceil(B / (tile_m r)), ceil(Cout / tile_n))``; per CTA and 64-wide p tile: two index
    tiles (one for the cached kernel), one W tile ``[64, tile_n]`` shared by the CTA's ``r`` batch
    sub-tiles, and one A tile ``[64, tile_m]`` per sub-tile that starts inside the batch. So the
    **weight stream** ``= CTAs * P64/64 * 64 * tile_n * 2`` halves when ``r`` doubles, while the A
    stream (every sub-tile reads its own inputs, once per output-channel tile) does not change.

    Returns a dict: ctas, w_bytes, a_bytes, idx_bytes, y_bytes, gathered (sum of the four),
    flops (useful), padded_flops (tile work incl. padding), intensity (useful FLOPs per gathered byte),
    smem (per-CTA tile memory estimate), ctas_per_sm_h200 ... as floats/ints.
    """
    b, tm, tn, r = int(batch), int(tile_m), int(tile_n), int(r)
    nout, cout, p64 = shape["nout"], shape["cout"], shape["p64"]
    groups = -(-b // (tm * r))
    otiles = -(-cout // tn)
    ptiles = -(-p64 // tile_k)
    ctas = nout * groups * otiles
    sub = nout * (-(-b // tm)) * otiles                  # A sub-tiles that run (past-batch ones are skipped)
    w_bytes = ctas * ptiles * tile_k * tn * 2.0
    a_bytes = sub * ptiles * tile_k * tm * 2.0
    idx_bytes = ctas * ptiles * tile_k * 4.0 * (1 if cached else 2)
    y_bytes = 2.0 * b * cout * nout
    flops = 2.0 * b * p64 * cout * nout
    padded = sub * ptiles * 2.0 * tm * tn * tile_k
    gathered = w_bytes + a_bytes + idx_bytes + y_bytes
    return {
        "batch": b, "tile_m": tm, "tile_n": tn, "r": r, "ctas": int(ctas), "w_bytes": w_bytes,
        "a_bytes": a_bytes, "idx_bytes": idx_bytes, "y_bytes": y_bytes, "gathered": gathered,
        "flops": flops, "padded_flops": padded, "padding_waste": 1.0 - flops / padded if padded else 0.0,
        "intensity": flops / gathered, "smem": tile_smem_estimate(tm, tn, r, tile_k, cached),
    }


def traffic_table(shape: dict, batch: int, tiles: Sequence[Tuple[int, int]] = ((16, 32), (32, 64), (64, 64), (64, 128)),
                  rs: Sequence[int] = (1, 2, 4)) -> List[dict]:
    """:func:`tile_traffic` for every (tile, r)."""
    return [tile_traffic(shape, batch, tm, tn, r) for tm, tn in tiles for r in rs]


def traffic_figure(shape: dict, batch: int, tiles=((16, 32), (32, 64), (64, 64), (64, 128)), rs=(1, 2, 4),
                   title: str = "", height: int = 520) -> go.Figure:
    """Left: gathered MB per call by stream (weight / input / index / output) for each tile shape (batch rows x
    output channels) and ``r``. Right: what ``r`` costs: tile memory per CTA (KiB) and CTAs per launch. The legend
    stands between the title and the plot, clear of the turned tile labels."""
    rows = traffic_table(shape, batch, tiles, rs)
    labels = [f"{t['tile_m']} x {t['tile_n']} tile<br>r = {t['r']}" for t in rows]
    fig = make_subplots(rows=1, cols=2, column_widths=[0.6, 0.4], horizontal_spacing=0.12,
                        specs=[[{}, {"secondary_y": True}]],
                        subplot_titles=("bytes gathered into tiles per call (MB)", "what r costs"))
    for key, name, colour in (("w_bytes", "weight stream", COLOURS["warp"]),
                              ("a_bytes", "input (A) stream", COLOURS["torch"]),
                              ("idx_bytes", "index tiles", COLOURS["grey"]),
                              ("y_bytes", "output", COLOURS["cached"])):
        fig.add_trace(go.Bar(x=labels, y=[round4(t[key] / 1e6) for t in rows], name=name,
                             marker_color=colour), row=1, col=1)
    fig.add_trace(go.Bar(x=labels, y=[round4(t["smem"] / 1024) for t in rows], name="tile memory per CTA (KiB)",
                         marker_color=COLOURS["dense"], showlegend=True), row=1, col=2)
    fig.add_trace(go.Scatter(x=labels, y=[t["ctas"] for t in rows], name="CTAs per launch", mode="lines+markers",
                             line=dict(color="black")), row=1, col=2, secondary_y=True)
    fig.update_layout(barmode="stack", margin=dict(l=10, r=10, b=10))
    fig.update_yaxes(title_text="gathered per call (MB)", row=1, col=1)
    fig.update_yaxes(title_text="tile memory per CTA (KiB)", row=1, col=2)
    fig.update_yaxes(title_text="launch size (CTAs)", type="log", dtick=1, showgrid=False, row=1, col=2,
                     secondary_y=True)
    fig.update_xaxes(title_text="tile and weight reuse r")
    figure_layout.headed(fig, height, title or (f"The traffic model: Nout={shape['nout']}, Cout={shape['cout']}, "
                                                f"P64={shape['p64']}, B={batch}"))
    return fig

def node_gemm(meta: TrainingMeta, x: torch.Tensor, weight: torch.Tensor, node: int) -> dict:
    """Output node ``node`` as one small GEMM (docs/operator.md §2.2), in fp64 on the CPU.

    ``A_n = xpad[:, input_linear[n]]`` ``[B, P64]`` (pad entries read the zero column),
    ``W_n = W^T[weight_linear[n]]`` ``[P64, Cout]``, ``y_n = A_n @ W_n`` ``[B, Cout]`` (no bias).
    """
    from fovi_lab.ops.reference import pad_flat_input
    meta = meta.to("cpu")
    n = int(node)
    if not 0 <= n < meta.nout:
        raise IndexError(f"node: expected 0 <= node < Nout={meta.nout}, got {node}")
    xpad = pad_flat_input(x.detach().cpu().double(), meta)
    il = meta.input_linear[n].long()
    wl = meta.weight_linear[n].long()
    a = xpad[:, il]
    wn = weight.detach().cpu().double().t()[wl]
    return {"A": a, "W": wn, "y": a @ wn, "input_linear": il, "weight_linear": wl,
            "is_pad": il == meta.pad_column}


def node_gemm_figure(meta: TrainingMeta, x: torch.Tensor, weight: torch.Tensor, node: int,
                     tile_m: int = 32, tile_n: int = 64, max_rows: int = 64, height: int = 420) -> go.Figure:
    """``A_n``, ``W_n`` and ``y_n = A_n W_n`` of one node as heat maps, with the tile grid drawn on:
    64-wide p tiles (the kernel's K loop), ``tile_m`` batch rows, ``tile_n`` output channels. Zero
    columns of ``A_n`` are the pad neighbours and the P..P64 fillers."""
    d = node_gemm(meta, x, weight, node)
    a, wn, y = d["A"][:max_rows], d["W"], d["y"][:max_rows]
    b, p64 = a.shape
    cout = wn.shape[1]
    fig = make_subplots(rows=1, cols=3, column_widths=[0.5, 0.25, 0.25], horizontal_spacing=0.06,
                        subplot_titles=(f"A_n (node {node}): gathered inputs<br>[B, P64]", "W_n<br>[P64, Cout]",
                                        "y_n = A_n W_n<br>[B, Cout]"))
    rnd = lambda t: np.round(t.numpy(), 2).astype(np.float32)  # noqa: E731
    fig.add_trace(go.Heatmap(z=rnd(a), colorscale="RdBu", zmid=0, showscale=False), row=1, col=1)
    zero_cols = torch.nonzero(d["is_pad"]).flatten().tolist()
    fig.add_trace(go.Scatter(x=zero_cols, y=[-1.5] * len(zero_cols), mode="markers", cliponaxis=False,
                             name="zero columns of A_n (pad neighbours, P..P64 fillers)",
                             marker=dict(symbol="triangle-down", size=7, color=COLOURS["fail"])), row=1, col=1)
    fig.add_trace(go.Heatmap(z=rnd(wn), colorscale="RdBu", zmid=0, showscale=False), row=1, col=2)
    fig.add_trace(go.Heatmap(z=rnd(y), colorscale="RdBu", zmid=0, showscale=False), row=1, col=3)
    line = dict(color="black", width=1)
    for p in range(64, p64, 64):
        fig.add_vline(x=p - 0.5, line=line, row=1, col=1)
        fig.add_hline(y=p - 0.5, line=line, row=1, col=2)
    for m in range(tile_m, b, tile_m):
        fig.add_hline(y=m - 0.5, line=dict(color="black", width=1, dash="dot"), row=1, col=1)
        fig.add_hline(y=m - 0.5, line=dict(color="black", width=1, dash="dot"), row=1, col=3)
    for o in range(tile_n, cout, tile_n):
        fig.add_vline(x=o - 0.5, line=dict(color="black", width=1, dash="dot"), row=1, col=2)
        fig.add_vline(x=o - 0.5, line=dict(color="black", width=1, dash="dot"), row=1, col=3)
    for col in (1, 2, 3):
        fig.update_yaxes(autorange="reversed", row=1, col=col)
    fig.update_xaxes(title_text="p (solid lines: 64-wide p tiles)", row=1, col=1)
    fig.update_xaxes(title_text="channel o (index)", row=1, col=2)
    fig.update_xaxes(title_text="channel o (index)", row=1, col=3)
    fig.update_yaxes(title_text="batch row b (index)", row=1, col=1)
    fig.update_yaxes(title_text="p (index)", row=1, col=2)
    fig.update_yaxes(title_text="batch row b (index)", row=1, col=3)
    fig.update_layout(margin=dict(l=10, r=10))
    figure_layout.fit_top(fig)
    figure_layout.legend_below(fig, height)
    return fig


def h200_roof() -> dict:
    """The H200 datasheet roof that section 3 and the roofline figure read (:class:`fovi_lab.bench.common.Roofline`):
    ``tflops`` (dense fp16 tensor-core peak), ``hbm_tbps`` (HBM bandwidth) and ``ridge``, their ratio in FLOPs per
    byte: to its right an ideal kernel is compute-bound, to its left memory-bound."""
    from fovi_lab.bench.common import Roofline
    tflops, tbps = Roofline.H200_FP16_TFLOPS, Roofline.H200_HBM_TBPS
    return {"tflops": tflops, "hbm_tbps": tbps, "ridge": tflops / tbps}
