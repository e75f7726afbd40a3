"""Notebook 09's kernel: the ``mma.sync`` fragments and lanes of the tensor-core forward kernels of
:mod:`fovi_lab.kernels.forward.mma`, and one of their configs run here.

* :func:`fragment_owner` / :func:`fragment_figure`: which lane holds which element of the A, B and D fragments of one
  ``mma.sync.m16n8k16`` (the layout the PTX ISA fixes).
* :func:`lane_channels`: the channel permutation that makes a lane's W loads one vector load.
* :func:`explore_mma`: run one mma config (:func:`mma_configs`) on a real layer's shape here, against the fp32
  reference; :func:`operand_mb`: the sizes of one forward's operands on a layer.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import plotly.graph_objects as go

from fovi_lab import lab as kl
import fovi_lab.lab.figure_layout as figure_layout
from fovi_lab.graph.layers import layer_meta
from fovi_lab.lab.labels import short_label

__all__ = ["mma_configs", "fragment_owner", "fragment_figure", "lane_channels", "explore_mma", "operand_mb"]


def mma_configs() -> Tuple[str, ...]:
    """The registered mma-family configs (the widget's choices)."""
    from fovi_lab.kernels import forward as F
    return tuple(n for n in F.uncached_config_names() if F.config_spec(n).variant in F.MMA_VARIANTS)


# ----------------------------------------------------------------------------------------------- fragments

def fragment_owner(kind: str) -> List[List[Tuple[int, int]]]:
    """``owner[row][col] = (lane, register)`` for the A (16 x 16), B (16 x 8, rows = k) or D (16 x 8) fragment
    of ``mma.sync.aligned.m16n8k16`` with fp16 inputs and fp32 accumulators (PTX ISA, "matrix fragments for
    mma.m16n8k16"), lane = 4*g + t."""
    if kind == "A":
        out = [[(0, 0)] * 16 for _ in range(16)]
        for lane in range(32):
            g, t = lane // 4, lane % 4
            for reg, (row, col0) in enumerate(((g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8))):
                for j in range(2):
                    out[row][col0 + j] = (lane, reg)
        return out
    if kind == "B":
        out = [[(0, 0)] * 8 for _ in range(16)]
        for lane in range(32):
            g, t = lane // 4, lane % 4
            for reg, k0 in enumerate((2 * t, 2 * t + 8)):
                for j in range(2):
                    out[k0 + j][g] = (lane, reg)
        return out
    if kind == "D":
        out = [[(0, 0)] * 8 for _ in range(16)]
        for lane in range(32):
            g, t = lane // 4, lane % 4
            for e in range(4):
                out[g + 8 * (e // 2)][2 * t + e % 2] = (lane, e)
        return out
    raise ValueError(f"kind: expected 'A', 'B' or 'D', got {kind!r}")


def fragment_figure(height: int = 460) -> go.Figure:
    """The three fragments side by side, each element coloured and labelled by the lane that holds it; the panel
    titles wrapped to their room."""
    from plotly.subplots import make_subplots
    titles = ("A = gathered W rows: 16 channels x 16 p entries", "B = gathered x: 16 p entries x 8 batch rows",
              "D = y^T accumulators (fp32): 16 channels x 8 batch rows")
    fig = make_subplots(rows=1, cols=3, subplot_titles=titles, column_widths=[0.44, 0.28, 0.28],
                        horizontal_spacing=0.06)
    for col, kind in enumerate(("A", "B", "D"), start=1):
        own = fragment_owner(kind)
        z = [[lane for lane, _ in row] for row in own]
        text = [[f"{lane}" for lane, _ in row] for row in own]
        fig.add_trace(go.Heatmap(z=z, text=text, texttemplate="%{text}", colorscale="Turbo", zmin=0, zmax=31,
                                 showscale=col == 3, colorbar=dict(title="lane"),
                                 hovertemplate="row %{y}, col %{x}: lane %{z}<extra>" + kind + "</extra>"),
                      row=1, col=col)
        fig.update_yaxes(autorange="reversed", row=1, col=col,
                         title_text="k (p entry)" if kind == "B" else "row (channel)")
        fig.update_xaxes(title_text="k (p entry)" if kind == "A" else "col (batch row)", row=1, col=col)
    fig.update_layout(margin=dict(b=50))
    figure_layout.headed(fig, height, "mma.sync.m16n8k16: which of a warp's 32 lanes holds which element", legend=None)
    return fig


def lane_channels(m_tiles: int, o0: int = 0) -> List[List[int]]:
    """``channels[g]``: the 2*MT output channels lane group ``g`` (lanes 4g..4g+3) multiplies, in register order
    (m-tile mi, then accumulator row half h): consecutive, so one vector load of a W^T row fetches them."""
    from fovi_lab.kernels.forward.mma import mma_channel
    return [[mma_channel(m_tiles, o0, g, mi, h) for mi in range(m_tiles) for h in range(2)] for g in range(8)]


# ----------------------------------------------------------------------------------------------- run here

def explore_mma(layer: str = "alex_L0", batch: int = 16, config: Optional[str] = None, nodes: Optional[int] = 48,
                device=None) -> dict:
    """One mma config on ``layer``'s shape (its first ``nodes`` output nodes; None: all) at ``batch``, on this
    machine, NaN-prefilled, against the fp32 reference. ``config`` None: the pick for the full layer's shape."""
    import torch
    from fovi_lab.kernels import forward as F
    device = kl.default_device() if device is None else device
    full = layer_meta(layer)
    pick = F.select_config(batch, full.cout, full.nout, full.p64, in_channels=full.cin,
                                           node_major=full.cin >= 32, q=full.q)
    config = config or pick
    pb = kl.make_problem(layer, batch=batch, device=device, nodes=nodes)
    m = pb.meta
    y, plan, dt, err, ref_name = kl.run_checked(pb, config)
    return dict(layer=layer, B=batch, nodes=m.nout, config=config, pick=pick, err=err, ms=dt, device=device,
                finite=bool(torch.isfinite(y).all()), split=getattr(plan, "split", None),
                line=kl.parity_line(f"{short_label(config)}, on {layer} ({m.nout} nodes) B={batch} vs {ref_name}", err,
                                    1e-2))


def operand_mb(layer: str, batch: int) -> dict:
    """The sizes (10^6 bytes, fp16) of one forward's operands on ``layer`` at ``batch``, from its tables' shape:
    ``x [B, Cin*Nin]``, the per-call ``W^T [Q, Cout]`` layout, the weight rows the nodes read
    (``Nout * P64 * Cout``, repeats counted), and ``y [B, Cout, Nout]``."""
    m = layer_meta(layer)
    return dict(layer=layer, B=batch, x=2e-6 * batch * m.cin * m.nin, wt=2e-6 * m.q * m.cout,
                node_rows=2e-6 * m.nout * m.p64 * m.cout, y=2e-6 * batch * m.cout * m.nout)
